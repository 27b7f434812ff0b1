-- A tiny test harness for headless Neovim (busted is not packaged for Debian 12's Neovim 0.7):
-- T.test(name, fn) registers, T.run() runs them in order and exits Neovim with 0 (all passed),
-- 1 (a failure) or 77 (T.skip(reason) was called before run: the whole file skips).
-- Asynchronous tests wait with T.wait(ms, predicate), which runs the event loop.
local T = { tests = {}, failures = 0 }

function T.test(name, fn)
  T.tests[#T.tests + 1] = { name = name, fn = fn }
end

local function fmt(v)
  return type(v) == 'string' and string.format('%q', v) or vim.inspect(v)
end

function T.eq(got, want, what)
  if not vim.deep_equal(got, want) then
    error(string.format('%s: got %s, want %s', what or 'value', fmt(got), fmt(want)), 2)
  end
end

function T.ok(cond, what)
  if not cond then
    error('expected true: ' .. (what or '?'), 2)
  end
end

--- Run the event loop until pred() is true or ms pass; fails the test on time-out.
function T.wait(ms, pred, what)
  if not vim.wait(ms, pred, 5) then
    error('timed out after ' .. ms .. ' ms waiting for ' .. (what or 'a condition'), 2)
  end
end

function T.skip(reason)
  io.stdout:write('SKIP: ' .. reason .. '\n')
  io.stdout:flush()
  os.exit(77)
end

function T.run()
  for _, t in ipairs(T.tests) do
    local t0 = vim.loop.hrtime()
    local ok, err = xpcall(t.fn, debug.traceback)
    local ms = (vim.loop.hrtime() - t0) / 1e6
    if ok then
      io.stdout:write(string.format('ok - %s (%.0f ms)\n', t.name, ms))
    else
      T.failures = T.failures + 1
      io.stdout:write('not ok - ' .. t.name .. '\n' .. err .. '\n')
    end
    io.stdout:flush()
  end
  io.stdout:write(string.format('%d tests, %d failed\n', #T.tests, T.failures))
  io.stdout:flush()
  os.exit(T.failures == 0 and 0 or 1)
end

return T
