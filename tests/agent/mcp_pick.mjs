// A one-tool stdio MCP server (@modelcontextprotocol/sdk) whose schema leaves a random model no
// way to ramble: `pick` takes a colour and a shade from enums (64 pairs, so that the
// agent's repeated-call stop is rare), nothing else. Used where a real model stack
// (the tiny random model behind `spark-agent serve`) must produce calls that always complete.
import { Server } from '@modelcontextprotocol/sdk/server/index.js';
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js';
import { CallToolRequestSchema, ListToolsRequestSchema } from '@modelcontextprotocol/sdk/types.js';

const tools = [{ name: 'pick', description: 'Pick a colour.',
  inputSchema: { type: 'object', properties: {
    color: { type: 'string', enum: ['red', 'green', 'blue', 'cyan', 'pink', 'gray', 'gold', 'teal'] },
    shade: { type: 'string', enum: ['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'] } },
  required: ['color', 'shade'], additionalProperties: false } }];
const server = new Server({ name: 'spark-pick', version: '1.0.0' }, { capabilities: { tools: {} } });
server.setRequestHandler(ListToolsRequestSchema, async () => ({ tools }));
server.setRequestHandler(CallToolRequestSchema, async (req) => {
  if (req.params.name !== 'pick') throw new Error(`unknown tool ${req.params.name}`);
  const a = req.params.arguments ?? {};
  return { content: [{ type: 'text', text: `picked ${a.color} ${a.shade}` }] };
});
await server.connect(new StdioServerTransport());
