-- The server's access token, in the order `spark-agent serve` uses: an explicit setting,
-- SPARK_API_KEY, then $XDG_CONFIG_HOME/spark-agent/token (~/.config by default).
local M = {}

function M.path()
  local base = os.getenv('XDG_CONFIG_HOME')
  if not base or base == '' then
    base = (os.getenv('HOME') or '') .. '/.config'
  end
  return base .. '/spark-agent/token'
end

--- The token, or '' when none is configured or readable.
function M.find(setting)
  if setting and setting ~= '' then
    return vim.trim(setting)
  end
  local env = os.getenv('SPARK_API_KEY')
  if env and env ~= '' then
    return vim.trim(env)
  end
  local f = io.open(M.path(), 'r')
  if not f then
    return ''
  end
  local t = f:read('*a') or ''
  f:close()
  return vim.trim(t)
end

return M
