-- :checkhealth spark
local M = {}

local h = vim.health or {}
local start = h.start or h.report_start or vim.fn['health#report_start']
local ok = h.ok or h.report_ok or vim.fn['health#report_ok']
local warn = h.warn or h.report_warn or vim.fn['health#report_warn']
local err = h.error or h.report_error or vim.fn['health#report_error']
local info = h.info or h.report_info or vim.fn['health#report_info']

function M.check()
  start('spark-agent')
  local v = vim.version()
  local ver = string.format('%d.%d.%d', v.major, v.minor, v.patch)
  if vim.fn.has('nvim-0.7') == 0 then
    err('Neovim ' .. ver .. ': 0.7 or newer is needed')
  elseif vim.fn.has('nvim-0.10') == 1 then
    ok('Neovim ' .. ver .. ': ghost text drawn inline')
  else
    ok('Neovim ' .. ver .. ': ghost text as overlay / end of line (inline needs 0.10)')
  end
  local spark = require('spark')
  if not spark.config then
    warn('require("spark").setup() has not run (plugin/spark.lua runs it unless vim.g.spark_no_setup)')
    return
  end
  local tok = require('spark.token')
  if tok.find(spark.config.token) == '' then
    warn('no access token: set token in setup(), SPARK_API_KEY, or start the server once to create '
      .. tok.path())
  else
    ok('access token found')
  end
  info('server URL: ' .. spark.config.url)
  local result, e, done = nil, nil, false
  spark.connect(function(client, cerr)
    result, e, done = client, cerr, true
  end)
  vim.wait(3000, function() return done end, 10)
  if not done then
    err('no answer from ' .. spark.config.url .. ' within 3 s')
  elseif not result then
    err('cannot connect: ' .. tostring(e), { 'start it with :SparkStart or `spark-agent serve`' })
  else
    local init = spark.state.init
    ok(string.format('connected: model %s, position encoding %s', spark.state.model,
      tostring(init.positionEncoding)))
    if init.model and init.model.fim == false then
      warn('the model has no fill-in-the-middle tokens: no inline completion')
    end
  end
end

return M
