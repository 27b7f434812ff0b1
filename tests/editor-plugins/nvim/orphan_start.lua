-- Run by nvim_orphans.sh in a headless Neovim: :SparkStart on a free port, wait for the
-- connection, write the port to $SPARK_ORPHAN_OUT, then, once $SPARK_ORPHAN_OUT.go exists (the
-- script has seen the server), leave as $SPARK_ORPHAN_MODE says: 'exit' (os.exit: no job
-- teardown, as the test harness exits), 'quit' (:qa!, the clean path); 'kill' waits to be
-- killed with SIGKILL.
local out, mode = os.getenv('SPARK_ORPHAN_OUT'), os.getenv('SPARK_ORPHAN_MODE')
local function fail(msg)
  io.stderr:write('orphan_start: ' .. msg .. '\n')
  os.exit(1)
end
local tcp = vim.loop.new_tcp()
tcp:bind('127.0.0.1', 0)
local port = tcp:getsockname().port
tcp:close()
local home = vim.fn.tempname()
vim.fn.mkdir(home, 'p')
vim.env.SPARK_API_KEY = 'orphan-test-token-' .. port
vim.env.XDG_CONFIG_HOME = home
vim.env.XDG_DATA_HOME = home
vim.g.spark = { url = 'ws://127.0.0.1:' .. port .. '/rpc', auto_connect = false,
  server_cmd = { os.getenv('SPARK_CLI'), 'serve' } }
vim.cmd('runtime plugin/spark.lua')
local spark = require('spark')
vim.cmd('SparkStart')
local up = vim.wait(120000, function()
  local s = spark.state
  return s.client ~= nil and s.client:is_open()
end, 50)
if not up then
  fail('the started server did not answer on port ' .. port)
end
local f = assert(io.open(out, 'w'))
f:write(port, '\n')
f:close()
vim.wait(60000, function() return mode ~= 'kill' and vim.loop.fs_stat(out .. '.go') ~= nil end, 20)
if mode == 'exit' then
  os.exit(0)
elseif mode == 'quit' then
  vim.cmd('qa!')
else
  vim.wait(600000, function() return false end, 100)
end
