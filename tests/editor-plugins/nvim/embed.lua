-- Drive a child Neovim (nvim --embed --headless) with the plugin loaded, as a user would: keys go
-- in with nvim_input and are processed by the child's own main loop (insert mode, mappings,
-- autocommands, timers), state is read back with nvim_exec_lua. Also starts the server the
-- tests talk to: `spark-agent serve` when SPARK_CLI is set and SPARK_TEST_FAKE is not, else the
-- scripted fake (fake_rpc_server.js).
local E = {}

local dir = os.getenv('SPARK_TEST_DIR')
E.plugin = dir .. '/../../editor-plugins/nvim'

--- Start a child; returns the channel.
function E.child(config)
  local ch = vim.fn.jobstart({ 'nvim', '--embed', '--headless', '-u', 'NONE', '-i', 'NONE', '-n',
    '--cmd', 'set rtp^=' .. E.plugin, '--cmd', 'set noswapfile updatetime=100' }, { rpc = true })
  assert(ch > 0, 'cannot start a child nvim')
  E.ch = ch
  E.lua([[vim.g.spark = ...; vim.cmd('runtime plugin/spark.lua')]], config)
  return ch
end

--- Run Lua in the child with `...` = the extra arguments; returns its result.
function E.lua(code, ...)
  return vim.fn.rpcrequest(E.ch, 'nvim_exec_lua', code, { ... })
end

function E.input(keys)
  return vim.fn.rpcrequest(E.ch, 'nvim_input', keys)
end

--- Poll `code` in the child until it returns a truthy value; returns that value.
function E.wait_for(ms, code, what, ...)
  local args = { ... }
  local got
  local ok = vim.wait(ms, function()
    got = vim.fn.rpcrequest(E.ch, 'nvim_exec_lua', code, args)
    return got ~= nil and got ~= false and got ~= vim.NIL
  end, 10)
  if not ok then
    error('timed out after ' .. ms .. ' ms waiting for ' .. (what or code), 2)
  end
  return got
end

local function free_port()
  local tcp = vim.loop.new_tcp()
  tcp:bind('127.0.0.1', 0)
  local port = tcp:getsockname().port
  tcp:close()
  return port
end

--- Who answers on port: 'ours' (GET /health with our token: 200), 'other' (any other status:
--- another test's server took the port between free_port and our bind), nil (nothing yet).
local function probe(port, token)
  local t = vim.loop.new_tcp()
  local done, status = false, nil
  local buf = ''
  t:connect('127.0.0.1', port, function(err)
    if err then
      done = true
      return
    end
    t:write('GET /health HTTP/1.0\r\nHost: 127.0.0.1:' .. port .. '\r\nAuthorization: Bearer '
      .. token .. '\r\n\r\n')
    t:read_start(function(rerr, data)
      if rerr or not data then
        done = true
        return
      end
      buf = buf .. data
      local code = buf:match('^HTTP/%d%.%d (%d+)')
      if code then
        status, done = tonumber(code), true
      end
    end)
  end)
  vim.wait(2000, function() return done end, 5)
  t:close()
  if status == nil then
    return nil
  end
  return status == 200 and 'ours' or 'other'
end

--- Start a server. Returns { url, token, real, job } or nil, reason when it cannot run here.
--- One start of the real server on a free port: the server, or nil when the port was taken (by
--- another test between free_port and our bind: our server exits, and the port answers with
--- another token); a server that does not start otherwise is an error.
local function start_real(cli, opts)
  local port = free_port()
  local token = 'editor-test-token-' .. port
  local home = vim.fn.tempname()
  vim.fn.mkdir(home, 'p')
  -- a fresh config (token) and data directory; the model cache (XDG_CACHE_HOME) is shared, so
  -- the default tiny model is generated once
  local env = { SPARK_API_KEY = token, XDG_CONFIG_HOME = home, XDG_DATA_HOME = home }
  for k, v in pairs(opts.env or {}) do
    env[k] = v
  end
  -- --exit-with-parent: the harness ends with os.exit, which skips Neovim's job teardown;
  -- without it the server outlived the test
  local cmd = { cli, 'serve', '--host', '127.0.0.1', '--port', tostring(port),
    '--exit-with-parent' }
  for _, a in ipairs(opts.args or {}) do
    cmd[#cmd + 1] = a
  end
  local log = {}
  local exited
  local job = vim.fn.jobstart(cmd, { env = env,
    on_stderr = function(_, d) vim.list_extend(log, d) end,
    on_stdout = function(_, d) vim.list_extend(log, d) end,
    on_exit = function(_, code) exited = code end })
  -- ready when our server answers on the port with our token
  local up = vim.wait(120000, function()
    return exited ~= nil or probe(port, token) == 'ours'
  end, 100)
  if up and exited == nil then
    return { url = string.format('ws://127.0.0.1:%d/rpc', port), token = token, real = true,
             job = job, log = log }
  end
  if exited ~= nil and probe(port, token) == 'other' then
    return nil
  end
  -- the binary is there: a server that does not start is a failure, not a skip
  error('spark-agent serve did not start (exit ' .. tostring(exited) .. '): '
    .. table.concat(log, '\n'))
end

--- Start a server. Returns { url, token, real, job } or nil, reason when it cannot run here.
function E.server(opts)
  opts = opts or {}
  local cli = os.getenv('SPARK_CLI')
  local use_real = cli and cli ~= '' and os.getenv('SPARK_TEST_FAKE') == nil
  if use_real then
    if vim.fn.executable(cli) == 0 then
      return nil, 'spark-agent is not built (' .. cli .. ')'
    end
    for _ = 1, 3 do
      local s = start_real(cli, opts)
      if s then
        return s
      end
    end
    error('spark-agent serve: three free ports were taken by other servers before it bound them')
  end
  if vim.fn.executable('node') == 0 then
    return nil, 'node is not installed (needed for the fake server)'
  end
  local modules = os.getenv('SPARK_NODE_MODULES') or (dir .. '/../node_modules')
  if vim.fn.isdirectory(modules .. '/ws') == 0 then
    return nil, 'the ws npm package is not installed in ' .. modules
  end
  local port
  local job = vim.fn.jobstart({ 'node', dir .. '/fake_rpc_server.js' }, {
    env = { SPARK_NODE_MODULES = modules },
    on_stdout = function(_, data)
      for _, l in ipairs(data) do
        if l:match('^%d+$') then
          port = tonumber(l)
        end
      end
    end,
  })
  if not vim.wait(10000, function() return port ~= nil end, 10) then
    return nil, 'the fake server did not start'
  end
  return { url = string.format('ws://127.0.0.1:%d/rpc', port), token = 'secret', real = false,
           job = job }
end

return E
