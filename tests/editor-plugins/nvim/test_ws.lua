-- The plugin's WebSocket framing and JSON-RPC client against an independent peer: the `ws`
-- npm package scripted by fake_rpc_server.js (handshake with token and subprotocol, streamed
-- notifications, UTF-8, fragmented frames, a 200 KB message, a server request, cancel, ping,
-- close, a refused handshake).
local T = require('harness')
local rpc = require('spark.rpc')

if vim.fn.executable('node') == 0 then
  T.skip('node is not installed')
end
local dir = os.getenv('SPARK_TEST_DIR')
local modules = os.getenv('SPARK_NODE_MODULES') or (dir .. '/../node_modules')
if vim.fn.isdirectory(modules .. '/ws') == 0 then
  T.skip('the ws npm package is not installed in ' .. modules .. ' (scripts/install-deps.sh)')
end

local port
vim.fn.jobstart({ 'node', dir .. '/fake_rpc_server.js' }, {
  env = { SPARK_NODE_MODULES = modules },
  on_stdout = function(_, data)
    for _, l in ipairs(data) do
      if l:match('^%d+$') then
        port = tonumber(l)
      end
    end
  end,
  on_stderr = function(_, data)
    local text = table.concat(data, '\n')
    if text ~= '' then
      io.stdout:write('fake server: ' .. text .. '\n')
    end
  end,
})
T.wait(10000, function() return port ~= nil end, 'the fake server to listen')
local url = string.format('ws://127.0.0.1:%d/rpc', port)

local client, init
local closed, logs, notes = nil, {}, {}

T.test('handshake with token and subprotocol, initialize', function()
  client = rpc.connect({
    url = url, token = 'secret', init = { clientInfo = { name = 'spark-nvim' } },
    on_ready = function(_, r) init = r end,
    on_close = function(code, reason) closed = { code, reason } end,
    on_log = function(p) logs[#logs + 1] = p.message end,
    on_notification = function(m) notes[#notes + 1] = m end,
  })
  T.wait(5000, function() return init ~= nil end, 'initialize')
  T.eq(init.model.id, 'fake')
  T.eq(init.protocol, 'spark-agent.jsonrpc.v1')
  T.eq(init.params.clientInfo.name, 'spark-nvim')
end)

T.test('request/response with UTF-8 and nested values', function()
  local res
  client:request('echo', { s = 'größe €𝄞', n = 3, list = { 1, 2 }, nested = { k = true } },
    function(r, e) res = r or e end)
  T.wait(5000, function() return res ~= nil end, 'echo')
  T.eq(res, { s = 'größe €𝄞', n = 3, list = { 1, 2 }, nested = { k = true } })
end)

T.test('streamed notifications in order, fragmented frame, log message', function()
  local pieces, done = {}, nil
  client:request('stream', {}, function(r) done = r end, function(method, p)
    pieces[#pieces + 1] = method .. ':' .. p.content
  end)
  T.wait(5000, function() return done ~= nil end, 'stream')
  T.eq(pieces, { 'chat/delta:a', 'chat/delta:é', 'chat/delta:ü€', 'chat/delta:frag' })
  T.eq(logs, { 'hi' })
end)

T.test('large messages both ways', function()
  local res
  client:request('big', { n = 200000 }, function(r) res = r end)
  T.wait(5000, function() return res ~= nil end, 'big')
  T.eq(#res.text, 200000)
  local echo
  local long = string.rep('abc', 30000)
  client:request('echo', { t = long }, function(r) echo = r end)
  T.wait(5000, function() return echo ~= nil end, 'echo of 90 KB')
  T.eq(echo.t, long)
end)

T.test('server request answered by the handler', function()
  client:on_request('agent/approval', function(params, reply)
    vim.defer_fn(function() reply({ approved = params.tool == 'edit_file' }) end, 10)
  end)
  local res
  client:request('ask', {}, function(r) res = r end)
  T.wait(5000, function() return res ~= nil end, 'ask')
  T.eq(res.answer, { approved = true })
end)

T.test('cancel sends $/cancelRequest and the error comes back', function()
  local err
  local _, cancel = client:request('slow', {}, function(_, e) err = e end)
  cancel()
  T.wait(5000, function() return err ~= nil end, 'cancel')
  T.eq(err.code, rpc.codes.RequestCancelled)
  local unknown
  client:request('nope', {}, function(_, e) unknown = e end)
  T.wait(5000, function() return unknown ~= nil end, 'unknown method')
  T.eq(unknown.code, rpc.codes.MethodNotFound)
end)

T.test('server ping gets a pong', function()
  client:request('ping', {}, function() end)
  T.wait(5000, function() return vim.tbl_contains(notes, 'test/pong') end, 'pong')
end)

T.test('server close reaches on_close; requests after it fail', function()
  local bye
  client:request('goodbye', {}, function(r) bye = r end)
  T.wait(5000, function() return closed ~= nil end, 'close')
  T.eq(bye, 'bye')
  T.eq(closed, { 1000, 'done' })
  local err
  client:request('echo', {}, function(_, e) err = e end)
  T.wait(1000, function() return err ~= nil end, 'error after close')
  T.eq(err.message, 'not connected')
end)

T.test('a wrong token is refused at the handshake', function()
  local msg
  rpc.connect({ url = url, token = 'wrong', on_error = function(m) msg = m end })
  T.wait(5000, function() return msg ~= nil end, 'refusal')
  T.ok(msg:match('401'), 'HTTP 401 in: ' .. msg)
  local refused
  rpc.connect({ url = 'ws://127.0.0.1:1/rpc', on_error = function(m) refused = m end })
  T.wait(5000, function() return refused ~= nil end, 'connection refused')
  T.ok(refused:match('cannot connect'), refused)
end)

-- the fake server exits when its stdin closes, as Neovim exits
T.run()
