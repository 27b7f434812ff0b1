// A small stdio MCP server on the official SDK (@modelcontextprotocol/sdk), for the agent's MCP
// client tests. Tools: add (integers), concat (strings, optional separator), fail (an error
// result), sleep (ms), env (a variable's value), write (a file in the working directory).
// argv[2] = "many" lists extra tools over several pages (pagination).
import { Server } from '@modelcontextprotocol/sdk/server/index.js';
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js';
import { CallToolRequestSchema, ListToolsRequestSchema } from '@modelcontextprotocol/sdk/types.js';
import { writeFileSync } from 'node:fs';

const tools = [
    { name: 'add', description: 'Add two integers.',
      inputSchema: { type: 'object', properties: { a: { type: 'integer' }, b: { type: 'integer' } },
                     required: ['a', 'b'], additionalProperties: false } },
    { name: 'concat', description: 'Join strings.',
      inputSchema: { type: 'object', properties: {
          parts: { type: 'array', items: { type: 'string', maxLength: 50 }, minItems: 1, maxItems: 5 },
          sep: { type: 'string', enum: ['', '-', ' '] } }, required: ['parts'] } },
    { name: 'fail', description: 'Always fails.', inputSchema: { type: 'object', properties: {} } },
    { name: 'sleep', description: 'Wait.',
      inputSchema: { type: 'object', properties: { ms: { type: 'integer', minimum: 0 } },
                     required: ['ms'] } },
    { name: 'env', description: 'Read an environment variable.',
      inputSchema: { type: 'object', properties: { name: { type: 'string' } }, required: ['name'] } },
    { name: 'write', description: 'Write a file in the working directory.',
      inputSchema: { type: 'object', properties: { path: { type: 'string' }, text: { type: 'string' } },
                     required: ['path', 'text'] } },
];
const many = process.argv[2] === 'many';
if (many)
    for (let i = 0; i < 7; i++)
        tools.push({ name: `extra_${i}`, inputSchema: { type: 'object', properties: {} } });
const PAGE = 4;

const server = new Server({ name: 'spark-test', version: '1.0.0' }, { capabilities: { tools: {} } });
server.setRequestHandler(ListToolsRequestSchema, async (req) => {
    if (!many) return { tools };
    const start = req.params?.cursor ? Number(req.params.cursor) : 0;
    const next = start + PAGE;
    return next < tools.length ? { tools: tools.slice(start, next), nextCursor: String(next) }
                               : { tools: tools.slice(start) };
});
const text = (t) => ({ content: [{ type: 'text', text: t }] });
server.setRequestHandler(CallToolRequestSchema, async (req) => {
    const a = req.params.arguments ?? {};
    switch (req.params.name) {
    case 'add': return text(String(a.a + a.b));
    case 'concat': return text(a.parts.join(a.sep ?? ''));
    case 'fail': return { content: [{ type: 'text', text: 'this tool always fails' }], isError: true };
    case 'sleep': await new Promise((r) => setTimeout(r, a.ms)); return text(`slept ${a.ms} ms`);
    case 'env': return text(process.env[a.name] ?? '(unset)');
    case 'write':
        try { writeFileSync(a.path, a.text); return text('written'); }
        catch (e) { return { content: [{ type: 'text', text: String(e.code ?? e) }], isError: true }; }
    default: throw new Error(`unknown tool ${req.params.name}`);
    }
});
process.stderr.write('spark-test MCP server ready\n');
await server.connect(new StdioServerTransport());
