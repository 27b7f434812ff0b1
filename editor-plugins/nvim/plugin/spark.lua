-- spark-agent: commands, and setup with vim.g.spark as options unless vim.g.spark_no_setup.
if vim.g.loaded_spark then
  return
end
vim.g.loaded_spark = true

local cmd = vim.api.nvim_create_user_command

cmd('SparkStart', function() require('spark').start_server() end, { desc = 'start spark-agent serve' })
cmd('SparkStop', function() require('spark').stop_server() end, { desc = 'stop the server' })
cmd('SparkConnect', function(a)
  local spark = require('spark')
  if a.args ~= '' then
    spark.config.url = a.args
  end
  if spark.state.client then
    spark.state.client:close()
    spark.state.client = nil
  end
  spark.connect(function(client, err)
    vim.notify(client and ('spark: connected to ' .. spark.state.model)
      or ('spark: ' .. tostring(err)), client and vim.log.levels.INFO or vim.log.levels.ERROR)
  end)
end, { nargs = '?', desc = 'connect to a server URL' })
cmd('SparkToggle', function()
  local c = require('spark').config.completion
  c.enabled = not c.enabled
  vim.notify('spark: completion ' .. (c.enabled and 'on' or 'off'))
end, {})
cmd('SparkChat', function(a)
  local chat = require('spark.chat')
  chat.open()
  if a.args ~= '' then
    chat.send(a.args)
  end
end, { nargs = '*', desc = 'open the chat (and send a message)' })
cmd('SparkChatReset', function() require('spark.chat').reset() end, {})
cmd('SparkAgent', function(a) require('spark.agent').start(a.args) end,
  { nargs = '+', desc = 'run the agent on the current directory' })
cmd('SparkAgentStop', function() require('spark.agent').stop() end, {})
cmd('SparkStatus', function() print(require('spark').status()) end, {})

if not vim.g.spark_no_setup then
  require('spark').setup(vim.g.spark or {})
end
