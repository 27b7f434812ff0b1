-- The Neovim plugin end to end, driven like a user in a child Neovim: document sync checked
-- against the server's copy, ghost text appears while typing, Tab accepts it, accept-word and
-- typing through a suggestion need no new request, a stale request is cancelled by further
-- typing, dismiss, a chat round trip, an agent run approved in the floating window.
-- Against `spark-agent serve` on the tiny model (SPARK_CLI) or, with SPARK_TEST_FAKE=1, the
-- scripted fake server.
local T = require('harness')
local E = require('embed')

if vim.fn.executable('nvim') == 0 then
  T.skip('nvim is not installed')
end

local ws_dir = vim.fn.tempname()
vim.fn.mkdir(ws_dir, 'p')
local script = ws_dir .. '.agent.json'
-- the scripted agent (real server): edit hello.txt, then answer
vim.fn.writefile({ vim.json.encode({
  'I will edit it.\n<tool_call>\n{"name": "edit_file", "arguments": {"path": "hello.txt", '
    .. '"old_text": "hello", "new_text": "goodbye"}}\n</tool_call>',
  'Replaced hello with goodbye.',
}) }, script)
vim.fn.writefile({ 'hello' }, ws_dir .. '/hello.txt')
vim.fn.system({ 'git', '-C', ws_dir, 'init', '-q' })
vim.fn.system({ 'git', '-C', ws_dir, '-c', 'user.name=t', '-c', 'user.email=t@t', 'add', '.' })
vim.fn.system({ 'git', '-C', ws_dir, '-c', 'user.name=t', '-c', 'user.email=t@t', 'commit', '-qm',
  'init' })

local server, why = E.server({ env = { SPARK_SERVE_AGENT_SCRIPT = script } })
if not server then
  T.skip(why)
end
io.stdout:write(string.format('# server: %s (%s)\n', server.url, server.real and 'spark-agent serve'
  or 'fake'))

E.child({ url = server.url, token = server.token, auto_connect = true,
  completion = { debounce_ms = 0, max_tokens = 6, time_budget_ms = 20000 },
  chat = { max_tokens = 8, temperature = 0 } })
E.lua([[vim.o.autoindent = false; vim.cmd('cd ' .. ...)]], ws_dir)

-- a helper in the child: call a server method and keep the answer in _G.answers[key]
E.lua([[
_G.answers = {}
_G.ask = function(key, method, params)
  require('spark').state.client:request(method, params, function(r, e)
    _G.answers[key] = r or { error = e }
  end)
end
_G.stats = function() return vim.deepcopy(require('spark').completer.stats) end
_G.shown = function() return require('spark.ghost').shown(0) end
]])

local function buf_text()
  return E.lua([[return table.concat(vim.api.nvim_buf_get_lines(0, 0, -1, false), '\n') .. '\n']])
end

T.test('connects and initializes', function()
  E.wait_for(15000, [[local c = require('spark').state.client; return c and c:is_open()]],
    'the connection')
  T.ok(E.lua([[return require('spark').status()]]):match('^spark: '), 'status line')
end)

T.test(':checkhealth spark reports the connection', function()
  E.lua([[vim.cmd('checkhealth spark')]])
  local text = table.concat(E.lua([[return vim.api.nvim_buf_get_lines(0, 0, -1, false)]]), '\n')
  T.ok(text:find('connected: model', 1, true), 'health output: ' .. text)
  T.ok(text:find('access token found', 1, true), 'health output: ' .. text)
  E.lua([[vim.cmd('bwipeout!')]])
end)

T.test('document sync: the server holds what the buffer holds after edits', function()
  E.lua([[vim.cmd('edit ' .. ...); vim.api.nvim_buf_set_lines(0, 0, -1, false,
    {'def add(a, b):', '    return a + b', '', 'print(add(1, 2))'})]], ws_dir .. '/util.py')
  E.lua([[require('spark').state.docs:ensure(0)]])
  -- edits by keys (insert, join, delete lines, undo) and by the API
  E.input('ggA  # sum<Esc>jddu3GJ')
  E.wait_for(2000, [[return vim.fn.mode() == 'n']], 'normal mode')
  E.lua([[vim.api.nvim_buf_set_lines(0, 1, 1, false, {'    """Add two numbers."""', 'é€𝄞'})]])
  E.lua([[_G.ask('doc', 'spark/documentText',
    {textDocument = {uri = require('spark.docs').uri(0)}})]])
  local d = E.wait_for(5000, [[return _G.answers.doc]], 'spark/documentText')
  T.eq(d.error, nil, 'documentText error')
  T.eq(d.text, buf_text(), 'server copy of the buffer')
end)

T.test('ghost text appears while typing and Tab accepts it', function()
  E.input('<Esc>')
  E.lua([[vim.api.nvim_buf_set_lines(0, 0, -1, false, {'def add(a, b):', '    return a + b', '',
    'def mul(a, b):', ''})]])
  local sent0 = E.lua('return _G.stats().sent')
  E.input('GA    ret')
  local g = E.wait_for(20000, [[return _G.shown()]], 'ghost text')
  local s = E.lua([[return require('spark').state.suggestion]])
  T.eq(g.text, s.text, 'ghost text is the suggestion')
  T.eq({ g.row, g.col }, { 4, 7 }, 'ghost position')
  T.ok(E.lua('return _G.stats().sent') > sent0, 'a request went out')
  T.eq(E.lua([[return vim.fn.mode()]]), 'i')
  E.input('<Tab>')
  E.wait_for(2000, [[return _G.shown() == nil or vim.fn.line('.') > 5 or vim.fn.col('.') > 8]],
    'the accept')
  local text = buf_text()
  T.eq(text, 'def add(a, b):\n    return a + b\n\ndef mul(a, b):\n    ret' .. s.text .. '\n',
    'buffer after accept')
  E.input('<Esc>')
end)

T.test('accept word and typing through need no new request', function()
  E.input('<Esc>')
  E.lua([[vim.api.nvim_buf_set_lines(0, 0, -1, false, {'int main(void) {', '    int x = ', '}'})]])
  E.input('2GA')
  local first = E.wait_for(20000, [[return _G.shown()]], 'ghost text').text
  local sent = E.lua('return _G.stats().sent')
  local word, rest = require('spark.accept').word(first)
  E.input('<C-Right>')
  if rest ~= '' then
    local g = E.wait_for(5000, [[return _G.shown()]], 'the rest after accept word')
    T.eq(g.text, rest, 'rest of the suggestion after accept word')
    T.eq(E.lua('return _G.stats().sent'), sent, 'no new request after accept word')
    -- type the next character of the suggestion by hand
    local ch = vim.fn.strcharpart(rest, 0, 1)
    local key = ch == '<' and '<lt>' or ch == '\n' and '<CR>' or ch == ' ' and '<Space>'
      or (#ch == 1 and ch:byte() < 32) and ('<C-v>' .. ch) or ch
    E.input(key)
    local after = vim.fn.strcharpart(rest, 1)
    if after ~= '' then
      local g2 = E.wait_for(5000, [[return _G.shown()]], 'the rest after typing')
      T.eq(g2.text, after, 'rest after typing one character of it')
    end
    T.eq(E.lua('return _G.stats().sent'), sent, 'no new request while typing through')
    T.ok(E.lua('return _G.stats().cache_hits') >= 1, 'cache hits counted')
  else
    -- a one-word suggestion: accept word took all of it
    T.eq(word, first)
  end
  local line = E.lua([[return vim.api.nvim_get_current_line()]])
  T.ok(vim.startswith('    int x = ' .. first, line) or line:find(word, 1, true),
    'accepted text is in the buffer: ' .. line)
  E.input('<Esc>')
end)

T.test('further typing cancels the request in flight', function()
  E.input('<Esc>')
  if not server.real then
    E.lua([[_G.ask('delay', 'fake/setDelay', {ms = 2000})]])
    E.wait_for(2000, [[return _G.answers.delay ~= nil]], 'delay set')
  end
  -- a long prefix makes the real server's request take a while (prefill)
  E.lua([[local l = {}
    for i = 1, 30 do l[i] = string.format('value_%d = compute(%d, "%s")', i, i, ('x'):rep(i % 17)) end
    l[#l + 1] = ''
    vim.api.nvim_buf_set_lines(0, 0, -1, false, l)
    _G.cancel_base = _G.stats()]])
  E.input('GAy')
  E.wait_for(5000, [[return _G.stats().sent > _G.cancel_base.sent]], 'the first request')
  local inflight = E.lua([[return require('spark').completer.inflight ~= nil]])
  E.input('z')
  E.wait_for(5000, [[return _G.stats().sent > _G.cancel_base.sent + 1]], 'the second request')
  local st = E.lua('return _G.stats()')
  local base = E.lua('return _G.cancel_base')
  if inflight then
    T.eq(st.cancelled - base.cancelled, 1, 'the stale request was cancelled')
  else
    io.stdout:write('# the first request had come back before the second keystroke\n')
    T.ok(server.real, 'the fake server delays 2 s: the first request must still be in flight')
  end
  -- the connection keeps working after a cancel
  E.wait_for(60000, [[local s = _G.stats()
    return s.completed + s.errors > _G.cancel_base.completed + _G.cancel_base.errors]],
    'the second request to come back')
  T.eq(E.lua('return _G.stats().errors') - base.errors, 0,
    'errors (' .. tostring(E.lua([[return require('spark').completer.last_error]])) .. ')')
  E.input('<Esc>')
  if not server.real then
    E.lua([[_G.ask('delay2', 'fake/setDelay', {ms = 0})]])
  end
end)

T.test('dismiss removes the ghost text', function()
  E.input('<Esc>')
  E.lua([[vim.api.nvim_buf_set_lines(0, 0, -1, false, {'def f():', ''})]])
  E.input('GA    ')
  E.wait_for(20000, [[return _G.shown()]], 'ghost text')
  E.input('<C-]>')
  E.wait_for(2000, [[return _G.shown() == nil]], 'no ghost after dismiss')
  T.eq(E.lua([[return vim.api.nvim_get_current_line()]]), '    ')
  E.input('x')
  E.wait_for(20000, [[return _G.shown()]], 'ghost text again')
  E.input('<Esc>')
  E.wait_for(2000, [[return _G.shown() == nil]], 'no ghost after leaving insert mode')
end)

T.test('chat round trip streams into the chat buffer', function()
  E.lua([[
    local chat = require('spark.chat')
    chat.open()
    chat.send('Say hi', function(r, e) _G.answers.chat = r or { error = e } end)]])
  local r = E.wait_for(60000, [[return _G.answers.chat]], 'the chat answer')
  T.eq(r.error, nil, 'chat error')
  local lines = E.lua([[return vim.api.nvim_buf_get_lines(require('spark.chat').buf, 0, -1, false)]])
  local text = table.concat(lines, '\n')
  T.ok(text:find('## You\nSay hi\n\n## Assistant\n', 1, true), 'user turn shown: ' .. text)
  local shown = text:match('## Assistant\n(.*)$')
  T.eq(shown, r.message.content, 'streamed deltas add up to the final message')
  T.eq(E.lua([[return #require('spark.chat').messages]]), 2, 'history kept')
end)

T.test('agent run: approval in the floating window, events in the agent buffer', function()
  E.lua([[require('spark.agent').start('replace hello by goodbye in hello.txt',
    function(r, e) _G.answers.agent = r or { error = e } end)]])
  E.wait_for(60000, [[local w = require('spark.agent').approval_win
    return (w and vim.api.nvim_win_is_valid(w)) or _G.answers.agent]], 'the approval window')
  T.eq(E.lua([[return _G.answers.agent]]), vim.NIL, 'the run ended before asking')
  local float_text = E.lua([[return table.concat(vim.api.nvim_buf_get_lines(
    vim.api.nvim_win_get_buf(require('spark.agent').approval_win), 0, -1, false), '\n')]])
  T.ok(float_text:find('edit_file', 1, true), 'the float names the tool: ' .. float_text)
  E.input('y')
  local r = E.wait_for(60000, [[return _G.answers.agent]], 'the run result')
  T.eq(r.error, nil, 'agent error')
  T.eq(r.stop, 'answer')
  local out = table.concat(E.lua([[return vim.api.nvim_buf_get_lines(require('spark.agent').buf,
    0, -1, false)]]), '\n')
  T.ok(out:find('call edit_file', 1, true), 'tool call shown: ' .. out)
  T.ok(out:find('```diff', 1, true), 'diff shown: ' .. out)
  if server.real then
    T.eq(vim.fn.readfile(ws_dir .. '/hello.txt'), { 'goodbye' }, 'the edit happened')
  end
end)

T.test(':SparkStart runs the server command and connects; :SparkStop stops it', function()
  local tcp = vim.loop.new_tcp()
  tcp:bind('127.0.0.1', 0)
  local port = tcp:getsockname().port
  tcp:close()
  local cmd = server.real and { os.getenv('SPARK_CLI'), 'serve' }
    or { os.getenv('SPARK_TEST_DIR') .. '/fake_serve.sh', 'serve' }
  E.lua([[local port, cmd, real = ...
    local spark = require('spark')
    spark.state.client:close()
    spark.config.url = 'ws://127.0.0.1:' .. port .. '/rpc'
    spark.config.server_cmd = cmd
    spark.config.token = ''
    vim.env.SPARK_API_KEY = real and ('editor-start-token-' .. port) or 'secret'
    vim.env.XDG_CONFIG_HOME = vim.fn.tempname()]], port, cmd, server.real)
  E.wait_for(5000, [[return require('spark').state.client == nil]], 'the old connection to close')
  E.lua([[vim.cmd('SparkStart')]])
  E.wait_for(60000, [[local s = require('spark').state
    return s.client ~= nil and s.client:is_open() and s.server_job ~= nil]], 'the started server')
  T.ok(E.lua([[return require('spark').config.url]]):find(tostring(port), 1, true), 'url')
  E.lua([[_G.job = require('spark').state.server_job; vim.cmd('SparkStop')]])
  E.wait_for(10000, [[return vim.fn.jobwait({_G.job}, 0)[1] ~= -1]], 'the server to stop')
  T.eq(E.lua([[return require('spark').state.server_job == nil]]), true)
end)

T.run()
