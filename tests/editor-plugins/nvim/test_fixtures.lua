-- The shared protocol fixtures (tests/fixtures/protocol/*.json, docs/protocol.md section 11)
-- replayed against `spark-agent serve` through the Neovim plugin's own WebSocket client
-- (spark.ws): every frame the plugin's transport sends and receives in the documented exchanges,
-- malformed input included, matched with the documented placeholder rules.
local T = require('harness')
local E = require('embed')
local ws = require('spark.ws')

local src = os.getenv('SPARK_SOURCE_DIR') or (os.getenv('SPARK_TEST_DIR') .. '/../..')
local files = vim.fn.glob(src .. '/tests/fixtures/protocol/*.json', false, true)
table.sort(files)
if #files == 0 then
  T.skip('no fixtures in ' .. src .. '/tests/fixtures/protocol')
end
local cli = os.getenv('SPARK_CLI')
if not cli or vim.fn.executable(cli) == 0 then
  T.skip('spark-agent is not built (' .. tostring(cli) .. ')')
end

local EMPTY_MT = getmetatable(vim.empty_dict())

local function is_object(v)
  -- {} decodes to vim.empty_dict() (a marked table), [] to a plain empty table
  return type(v) == 'table' and (getmetatable(v) == EMPTY_MT
    or (next(v) ~= nil and not vim.tbl_islist(v)))
end

local function is_array(v)
  return type(v) == 'table' and getmetatable(v) ~= EMPTY_MT and vim.tbl_islist(v)
end

local function show(v)
  if v == nil then
    return '(absent)'
  end
  local ok, s = pcall(vim.json.encode, v)
  return ok and s or vim.inspect(v)
end

--- Does `val` match `pat`? Returns true, or false and a message naming the path.
local function match(pat, val, caps, where)
  where = where or '$'
  if type(pat) == 'string' and pat:sub(1, 1) == '$' then
    if pat:sub(1, 2) == '$$' then
      return val == pat:sub(2), where .. ': want ' .. pat:sub(2) .. ', got ' .. show(val)
    end
    local kind, name = pat:match('^%$(%a+):?(.*)$')
    local ok
    if kind == 'any' then
      ok = true
    elseif kind == 'absent' then
      ok = val == nil
    elseif kind == 'string' or kind == 'text' then
      ok = type(val) == 'string'
    elseif kind == 'number' then
      ok = type(val) == 'number'
    elseif kind == 'int' then
      ok = type(val) == 'number' and val == math.floor(val)
    elseif kind == 'bool' then
      ok = type(val) == 'boolean'
    elseif kind == 'object' then
      ok = is_object(val)
    elseif kind == 'array' then
      ok = is_array(val)
    elseif kind == 'null' then
      ok = val == vim.NIL
    elseif kind == 'capture' then
      ok = val ~= nil
      if ok then
        caps[name] = val
      end
    elseif kind == 'ref' then
      ok = vim.deep_equal(caps[name], val)
    else
      -- not a placeholder (method names such as "$/progress" are written as they are)
      ok = val == pat
    end
    return ok, where .. ': want ' .. pat .. ', got ' .. show(val)
  end
  if is_object(pat) then
    if not is_object(val) then
      return false, where .. ': want an object, got ' .. show(val)
    end
    for k, p in pairs(pat) do
      local ok, err = match(p, val[k], caps, where .. '.' .. k)
      if not ok then
        return false, err
      end
    end
    return true
  end
  if is_array(pat) then
    if not is_array(val) or #val ~= #pat then
      return false, where .. ': want an array of ' .. #pat .. ', got ' .. show(val)
    end
    for i, p in ipairs(pat) do
      local ok, err = match(p, val[i], caps, where .. '[' .. (i - 1) .. ']')
      if not ok then
        return false, err
      end
    end
    return true
  end
  return pat == val, where .. ': want ' .. show(pat) .. ', got ' .. show(val)
end

--- Replace "$ref:NAME" and "$var:NAME" in a message to send.
local function subst(v, caps, vars)
  if type(v) == 'string' then
    local ref = v:match('^%$ref:(.+)$')
    if ref then
      return caps[ref]
    end
    local var = v:match('^%$var:(.+)$')
    if var then
      return vars[var]
    end
    if v:sub(1, 2) == '$$' then
      return v:sub(2)
    end
    return v
  end
  if type(v) == 'table' then
    local out = getmetatable(v) == EMPTY_MT and vim.empty_dict() or {}
    for k, x in pairs(v) do
      out[k] = subst(x, caps, vars)
    end
    return out
  end
  return v
end

local servers = {}
local function server_for(fx)
  local key = fx.agentScript and fx.name or 'shared'
  if servers[key] then
    return servers[key]
  end
  local env = {}
  if fx.agentScript then
    local f = vim.fn.tempname() .. '.json'
    vim.fn.writefile({ vim.json.encode(fx.agentScript) }, f)
    env.SPARK_SERVE_AGENT_SCRIPT = f
  end
  local s = assert(E.server({ env = env }))
  servers[key] = s
  return s
end

local function open(s)
  local st = { inbox = {}, closed = nil, open = false }
  st.conn = assert(ws.connect({
    url = s.url, headers = { Authorization = 'Bearer ' .. s.token },
    protocols = { 'spark-agent.jsonrpc.v1' },
    on_open = function() st.open = true end,
    on_message = function(text)
      st.inbox[#st.inbox + 1] = vim.json.decode(text)
    end,
    on_close = function(code) st.closed = code end,
    on_error = function(m) st.err = m end,
  }))
  if not vim.wait(10000, function() return st.open or st.closed ~= nil end, 5) or not st.open then
    error('cannot open a connection: ' .. tostring(st.err))
  end
  return st
end

local function capabilities(s)
  local st = open(s)
  st.conn:send(vim.json.encode({ jsonrpc = '2.0', id = 1, method = 'initialize',
    params = vim.empty_dict() }))
  vim.wait(10000, function() return #st.inbox > 0 end, 5)
  st.conn:close(1000, '')
  local r = st.inbox[1] and st.inbox[1].result
  return r
end

local function workspace(files_)
  local dir = vim.fn.tempname()
  for name, text in pairs(files_) do
    local p = dir .. '/' .. name
    vim.fn.mkdir(vim.fn.fnamemodify(p, ':h'), 'p')
    local f = assert(io.open(p, 'w'))
    f:write(text)
    f:close()
  end
  local git = { 'git', '-C', dir, '-c', 'user.name=t', '-c', 'user.email=t@t' }
  vim.fn.system(vim.list_extend(vim.deepcopy(git), { 'init', '-q' }))
  vim.fn.system(vim.list_extend(vim.deepcopy(git), { 'add', '.' }))
  vim.fn.system(vim.list_extend(vim.deepcopy(git), { 'commit', '-qm', 'init' }))
  return dir
end

local skipped = 0

local function replay(path)
  local fx = vim.json.decode(table.concat(vim.fn.readfile(path), '\n'))
  local s = server_for(fx)
  local caps0 = capabilities(s) or {}
  for _, need in ipairs(fx.needs or {}) do
    local have = (need == 'fim' and caps0.model and caps0.model.fim == true)
      or (need == 'tools' and caps0.capabilities and caps0.capabilities.chat
          and caps0.capabilities.chat.tools == true)
      or (need == 'agent' and caps0.capabilities and caps0.capabilities.agent ~= nil)
    if not have then
      skipped = skipped + 1
      io.stdout:write(string.format('# skip %s: the server does not report %s\n', fx.name, need))
      return
    end
  end
  local vars = {}
  if fx.workspace then
    local dir = workspace(fx.workspace.files or {})
    vars.WORKSPACE_PATH, vars.WORKSPACE_URI = dir, vim.uri_from_fname(dir)
  end
  local ignore = {}
  for _, m in ipairs(fx.ignore or {}) do
    ignore[m] = true
  end
  local st = open(s)
  local caps = {}
  local pos = 1 -- next unread message in st.inbox
  local function next_msg(step_no)
    local ok = vim.wait(60000, function()
      while st.inbox[pos] and ignore[st.inbox[pos].method or ''] do
        pos = pos + 1
      end
      return st.inbox[pos] ~= nil or st.closed ~= nil
    end, 2)
    if not ok or not st.inbox[pos] then
      error(string.format('%s step %d: no message (connection %s)', fx.name, step_no,
        st.closed and ('closed ' .. st.closed) or 'open, timed out'), 0)
    end
    return st.inbox[pos]
  end
  for i, step in ipairs(fx.steps) do
    if step.send then
      st.conn:send(vim.json.encode(subst(step.send, caps, vars)))
    elseif step.sendRaw then
      st.conn:send(step.sendRaw)
    elseif step.sleepMs then
      vim.wait(step.sleepMs, function() return false end, 5)
    elseif step.expect and step['repeat'] then
      local following = fx.steps[i + 1]
      local n = 0
      while true do
        local m = next_msg(i)
        local probe = {}
        if following and following.expect and match(following.expect, m, vim.deepcopy(caps)) then
          break
        end
        local ok, err = match(step.expect, m, probe)
        if not ok then
          if n == 0 and step['repeat'] == '+' then
            error(string.format('%s step %d: %s', fx.name, i, err), 0)
          end
          if following and following.expect then
            local _, ferr = match(following.expect, m, {})
            error(string.format('%s step %d: neither the repeated pattern (%s) nor the next one '
              .. '(%s) matches', fx.name, i, err, ferr), 0)
          end
          break
        end
        for k, v in pairs(probe) do
          caps[k] = v
        end
        n = n + 1
        pos = pos + 1
      end
    elseif step.expect then
      local m = next_msg(i)
      local ok, err = match(step.expect, m, caps)
      if not ok then
        error(string.format('%s step %d: %s\n  message: %s', fx.name, i, err, show(m)), 0)
      end
      pos = pos + 1
    elseif step.unordered then
      local used = {}
      for _ = 1, #step.unordered do
        local m = next_msg(i)
        local found
        for j, p in ipairs(step.unordered) do
          if not used[j] and match(p, m, vim.deepcopy(caps)) then
            found = j
            break
          end
        end
        if not found then
          error(string.format('%s step %d: %s matches none of the unordered patterns', fx.name, i,
            show(m)), 0)
        end
        used[found] = true
        match(step.unordered[found], m, caps)
        pos = pos + 1
      end
    elseif step.expectClose then
      vim.wait(10000, function() return st.closed ~= nil end, 5)
      T.eq(st.closed, step.expectClose, fx.name .. ' step ' .. i .. ': close code')
    end
  end
  if not st.closed then
    st.conn:close(1000, '')
  end
end

for _, f in ipairs(files) do
  T.test(vim.fn.fnamemodify(f, ':t'), function()
    replay(f)
  end)
end

T.test('not every fixture was skipped', function()
  T.ok(skipped < #files, 'all ' .. #files .. ' fixtures skipped for missing capabilities')
end)

T.run()
