-- No Lua file of the plugin reads or writes a global it does not mean to: LuaJIT's bytecode
-- listing (jit.bc) shows every global access; anything outside the standard library and `vim`
-- is a misspelt or undeclared local (the kind of bug a callback referring to a local declared
-- on the same line leaves behind).
local T = require('harness')
local ok_bc, bc = pcall(require, 'jit.bc')
if not ok_bc then
  T.skip('this Neovim is not built with LuaJIT (no jit.bc)')
end

local allowed = {}
for _, n in ipairs({ 'vim', 'bit', 'jit', 'unpack', 'require', 'pairs', 'ipairs', 'type',
  'tostring', 'tonumber', 'string', 'table', 'math', 'os', 'io', 'pcall', 'xpcall', 'error',
  'select', 'setmetatable', 'getmetatable', 'next', 'assert', 'print', 'debug', 'rawget',
  'rawset', 'rawequal', 'coroutine' }) do
  allowed[n] = true
end

local root = os.getenv('SPARK_TEST_DIR') .. '/../../editor-plugins/nvim'
local files = vim.fn.globpath(root, '**/*.lua', false, true)

T.test('the plugin has Lua files', function()
  T.ok(#files >= 10, #files .. ' files under ' .. root)
end)

for _, f in ipairs(files) do
  T.test(vim.fn.fnamemodify(f, ':t'), function()
    local fn = assert(loadfile(f))
    local out = {}
    bc.dump(fn, { write = function(_, s) out[#out + 1] = s end, flush = function() end,
                  close = function() end }, true)
    local bad = {}
    for op, name in table.concat(out):gmatch('(G[GS]ET)%s+%d+%s+%d+%s+; "([^"]+)"') do
      if not allowed[name] then
        bad[#bad + 1] = op .. ' ' .. name
      end
    end
    T.eq(bad, {}, 'global accesses in ' .. f)
  end)
end

T.run()
