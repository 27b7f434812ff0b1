-- Keystroke -> ghost text latency and requests saved by the cache and the debounce, in a
-- scripted typing session in a child Neovim with the plugin, against `spark-agent serve`
-- (SPARK_CLI; the tiny model by default, SPARK_BENCH_MODEL for another) or the fake server
-- (SPARK_TEST_FAKE=1, for checking the script only). Run by bench/editor/run.sh.
--
-- The session: a short Python file typed character by character (key gaps from a fixed
-- pseudo-random sequence, 40-140 ms, a 700 ms pause after each line), and after each pause the
-- "user" types the first 6 characters of the suggestion on screen, as if it were what they
-- meant, then deletes them again. Latency is measured inside the child from the keystroke's
-- TextChangedI to the extmark being drawn, for keystrokes whose ghost text came from the
-- server (cache hits are reported apart: they draw in the same tick).
local E = require('embed')

local debounce = tonumber(os.getenv('SPARK_BENCH_DEBOUNCE') or '120')
local server = assert(E.server({ args = os.getenv('SPARK_BENCH_MODEL')
  and { '-m', os.getenv('SPARK_BENCH_MODEL') } or nil }))
E.child({ url = server.url, token = server.token,
  completion = { debounce_ms = debounce, max_tokens = tonumber(os.getenv('SPARK_BENCH_TOKENS')
    or '16'), time_budget_ms = 5000 } })
E.lua([[vim.o.autoindent = false
vim.cmd('edit ' .. vim.fn.tempname() .. '.py')
local spark = require('spark')
local ghost = require('spark.ghost')
_G.bench = { keys = 0, shows = {}, t_key = nil, key_id = 0 }
vim.api.nvim_create_autocmd('TextChangedI', { callback = function()
  _G.bench.keys = _G.bench.keys + 1
  _G.bench.key_id = _G.bench.key_id + 1
  _G.bench.t_key = vim.loop.hrtime()
  _G.bench.hits0 = spark.completer.stats.cache_hits
end })
local show = ghost.show
ghost.show = function(...)
  local b = _G.bench
  if b.t_key and b.shown_for ~= b.key_id then
    b.shown_for = b.key_id
    local cached = spark.completer.stats.cache_hits > b.hits0
    b.shows[#b.shows + 1] = { ms = (vim.loop.hrtime() - b.t_key) / 1e6, cached = cached }
  end
  return show(...)
end]])
local ok_conn = vim.wait(30000, function()
  return E.lua([[local c = require('spark').state.client; return c ~= nil and c:is_open()]])
end, 20)
assert(ok_conn, 'no connection')

local text = {
  'import os',
  'def read_config(path):',
  '    with open(path) as f:',
  '        lines = f.read().splitlines()',
  '    result = {}',
  '    for line in lines:',
  '        key, _, value = line.partition("=")',
  '        result[key.strip()] = value.strip()',
  '    return result',
  'def main():',
  '    cfg = read_config(os.environ.get("CFG", "app.cfg"))',
  '    print(cfg)',
}

local seed = 12345
local function gap()
  seed = (seed * 1103515245 + 12345) % 2147483648
  return 40 + seed % 100
end
local function sleep(ms)
  vim.wait(ms, function() return false end, 1)
end
local function key(ch)
  if ch == '<' then
    return '<lt>'
  elseif ch == ' ' then
    return '<Space>'
  end
  return ch
end

local follow_keys, follow_hits = 0, 0
local mode = os.getenv('SPARK_BENCH_MODE') or 'session'
E.input('i')
if mode == 'latency' then
  -- one keystroke at a time, each waiting for its ghost text (up to 10 s): the latency of a
  -- keystroke after a pause, with nothing else in flight
  local n = tonumber(os.getenv('SPARK_BENCH_KEYS') or '60')
  local typed = 0
  for _, line in ipairs(text) do
    for i = 1, #line do
      if typed >= n then
        break
      end
      local before = E.lua('return #_G.bench.shows')
      E.input(key(line:sub(i, i)))
      typed = typed + 1
      vim.wait(10000, function() return E.lua('return #_G.bench.shows') > before end, 2)
      sleep(50)
    end
    if typed >= n then
      break
    end
    E.input('<CR>')
    sleep(debounce + 50)
  end
  text = {}
end
for li, line in ipairs(text) do
  for i = 1, #line do
    E.input(key(line:sub(i, i)))
    sleep(gap())
  end
  sleep(700)
  -- follow the suggestion for up to 6 characters
  local g = E.lua([[return require('spark.ghost').shown(0)]])
  if g and g ~= vim.NIL then
    local first = g.text:match('^[^\n]*') or ''
    local n = math.min(6, vim.fn.strchars(first))
    local before = E.lua([[return vim.deepcopy(require('spark').completer.stats)]])
    for i = 0, n - 1 do
      local ch = vim.fn.strcharpart(first, i, 1)
      E.input(ch == '\t' and '<C-v><Tab>' or key(ch))
      sleep(gap())
    end
    sleep(300)
    local after = E.lua([[return vim.deepcopy(require('spark').completer.stats)]])
    follow_keys = follow_keys + n
    follow_hits = follow_hits + (after.cache_hits - before.cache_hits)
    for _ = 1, n do
      E.input('<BS>')
    end
    sleep(200)
  end
  if li < #text then
    E.input('<CR>')
    sleep(gap())
  end
end
sleep(1000)
local b = E.lua('return _G.bench')
local st = E.lua([[return require('spark').completer.stats]])

local lat = {}
local cached_n = 0
for _, s in ipairs(b.shows) do
  if s.cached then
    cached_n = cached_n + 1
  else
    lat[#lat + 1] = s.ms
  end
end
table.sort(lat)
local function pct(p)
  if #lat == 0 then
    return 0 / 0
  end
  return lat[math.max(1, math.ceil(p / 100 * #lat))]
end
local out = io.stdout
out:write(string.format('server: %s, mode %s, debounce %d ms, max_tokens %s\n',
  server.real and 'spark-agent serve' or 'fake', mode, debounce,
  os.getenv('SPARK_BENCH_TOKENS') or '16'))
out:write(string.format('keystrokes (TextChangedI): %d\n', b.keys))
out:write(string.format('ghost text from the server: %d, keystroke -> ghost p50 %.1f ms, p99 %.1f ms, '
  .. 'min %.1f, max %.1f\n', #lat, pct(50), pct(99), lat[1] or 0 / 0, lat[#lat] or 0 / 0))
out:write(string.format('ghost text from the cache: %d\n', cached_n))
out:write(string.format('completer: calls %d, sent %d, cache hits %d, debounced %d, cancelled %d, '
  .. 'completed %d, errors %d\n', st.calls, st.sent, st.cache_hits, st.debounced, st.cancelled,
  st.completed, st.errors))
out:write(string.format('requests saved vs one per keystroke: %d of %d (%.0f%%); by the cache %d, '
  .. 'by the debounce %d\n', st.calls - st.sent, st.calls, 100 * (st.calls - st.sent) / st.calls,
  st.cache_hits, st.debounced))
out:write(string.format('following suggestions: %d keys typed through, %d served by the cache\n',
  follow_keys, follow_hits))
out:flush()
os.exit(0)
