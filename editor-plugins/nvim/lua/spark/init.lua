-- spark-agent for Neovim: ghost-text completion, chat and agent runs against `spark-agent serve`
-- (docs/protocol.md). require('spark').setup(opts) once (plugin/spark.lua does it with
-- vim.g.spark as opts unless vim.g.spark_no_setup is set).
local rpc = require('spark.rpc')
local Docs = require('spark.docs')
local Ring = require('spark.ring')
local Cache = require('spark.cache')
local Completer = require('spark.completer')
local accept = require('spark.accept')
local ghost = require('spark.ghost')
local token = require('spark.token')

local M = {}

M.defaults = {
  url = 'ws://127.0.0.1:8088/rpc',
  token = '', -- empty: SPARK_API_KEY, then $XDG_CONFIG_HOME/spark-agent/token
  -- :SparkStart (--host/--port from url and --exit-with-parent are appended)
  server_cmd = { 'spark-agent', 'serve' },
  model = '', -- -m for :SparkStart
  auto_connect = true,
  completion = {
    enabled = true,
    debounce_ms = 120,
    max_tokens = 64,
    time_budget_ms = 2000,
    temperature = 0,
    max_prefix_lines = 256,
    max_suffix_lines = 64,
  },
  context = { max_chunks = 16, chunk_lines = 64, budget = 8192 },
  chat = { temperature = 0.7, max_tokens = 1024 },
  agent = { approval = 'ask' },
  keys = {
    accept = '<Tab>',
    accept_word = '<C-Right>',
    accept_line = '<S-Tab>',
    dismiss = '<C-]>',
  },
}

M.state = {
  client = nil, docs = nil, connecting = false, waiters = {}, model = nil, tps = nil,
  suggestion = nil, -- { buf, row, col, text }
  server_job = nil, init = nil, last_place = nil,
}

local S = M.state

local function notify(msg, level)
  vim.notify('spark: ' .. msg, level or vim.log.levels.INFO)
end

--- Connect if not connected; cb(client or nil, err) when ready (queued while connecting).
function M.connect(cb)
  cb = cb or function() end
  if S.client and S.client:is_open() then
    return cb(S.client)
  end
  S.waiters[#S.waiters + 1] = cb
  if S.connecting then
    return
  end
  S.connecting = true
  local finished = false -- this attempt's waiters were answered
  local function finish(client, err)
    if finished then
      return
    end
    finished = true
    S.connecting = false
    local w = S.waiters
    S.waiters = {}
    for _, f in ipairs(w) do
      f(client, err)
    end
  end
  local cwd = vim.loop.cwd()
  local client, err -- declared first: the callbacks below compare against it
  client, err = rpc.connect({
    url = M.config.url,
    token = token.find(M.config.token),
    init = {
      clientInfo = { name = 'spark-nvim', version = '0.1.0' },
      capabilities = { general = { positionEncodings = { 'utf-8', 'utf-16' } } },
      workspaceFolders = { { uri = vim.uri_from_fname(cwd), name = vim.fn.fnamemodify(cwd, ':t') } },
    },
    on_ready = function(c, init)
      S.client, S.init, S.root = c, init, cwd
      S.docs = Docs.new(c)
      S.model = init.model and init.model.id or 'model'
      c:on_request('agent/approval', function(params, reply)
        require('spark.agent').on_approval(params, reply)
      end)
      finish(c)
    end,
    on_error = function(msg)
      finish(nil, msg)
    end,
    on_close = function()
      if S.client == client then
        S.client, S.docs = nil, nil
        M.dismiss()
      end
      finish(nil, 'connection closed')
    end,
    on_log = function(p)
      if M.config.log then
        M.config.log(p.message)
      end
    end,
  })
  if not client then
    finish(nil, err)
  end
end

--- Connect with `root` among the workspace folders (the agent may only work there): the
--- connection made from another directory is replaced. cb(client or nil, err).
function M.connect_for_root(root, cb)
  local c = S.client
  if c and c:is_open() and S.root then
    local base = S.root:gsub('/$', '') .. '/'
    if root == S.root or root:sub(1, #base) == base then
      return cb(c)
    end
  end
  if c then
    S.client, S.docs = nil, nil
    M.dismiss()
    c:close()
  end
  M.connect(cb)
end

--- For the statusline: "spark: MODEL N tok/s", or "spark: off".
function M.status()
  if not (S.client and S.client:is_open()) then
    return 'spark: off'
  end
  if S.tps then
    return string.format('spark: %s %.0f tok/s', S.model, S.tps)
  end
  return 'spark: ' .. S.model
end

-- ---- completion ----

local function position_character(line, col)
  if S.init and S.init.positionEncoding == 'utf-16' then
    local _, u16 = vim.str_utfindex(line, col)
    return u16
  end
  return col
end

--- The request for the cursor in `buf` at (row, col) (0-based, byte col).
function M.build_request(buf, row, col)
  local c = M.config.completion
  local first = math.max(0, row - c.max_prefix_lines)
  local lines = vim.api.nvim_buf_get_lines(buf, first, row + 1 + c.max_suffix_lines, false)
  local cur = lines[row - first + 1] or ''
  local before = {}
  for i = 1, row - first do
    before[i] = lines[i]
  end
  local prefix = table.concat(before, '\n') .. (#before > 0 and '\n' or '') .. cur:sub(1, col)
  local after = { cur:sub(col + 1) }
  for i = row - first + 2, #lines do
    after[#after + 1] = lines[i]
  end
  local suffix = table.concat(after, '\n')
  local uri = S.docs:ensure(buf)
  local params = {
    textDocument = { uri = uri },
    position = { line = row, character = position_character(cur, col) },
    maxTokens = c.max_tokens, timeBudgetMs = c.time_budget_ms, temperature = c.temperature,
    maxPrefixLines = c.max_prefix_lines, maxSuffixLines = c.max_suffix_lines,
  }
  if cur:sub(col + 1):match('%S') then
    params.singleLine = true -- in the middle of a line only the rest of that line makes sense
  end
  local maxn = S.init and S.init.limits and S.init.limits.maxExtraChunks or 32
  local chunks = M.ring:take(uri, first, row + 1 + c.max_suffix_lines, M.config.context.budget)
  if #chunks > 0 then
    local extra = {}
    for i = math.max(1, #chunks - maxn + 1), #chunks do
      local ch = chunks[i]
      extra[#extra + 1] = { uri = ch.uri, filename = vim.fn.fnamemodify(vim.uri_to_fname(ch.uri),
        ':.'), text = ch.text }
    end
    params.extra = extra
  end
  return { params = params, prefix = prefix, suffix = suffix, buf = buf }
end

local function fetch(req, done)
  return S.docs:request(req.buf, 'textDocument/inlineCompletion', req.params, function(r, err)
    if err then
      return done(nil, err.message)
    end
    if r.timings and r.timings.tokensPerSecond then
      S.tps = r.timings.tokensPerSecond
    end
    local item = r.items and r.items[1]
    done(item and item.insertText or '')
  end)
end

--- Ask for a suggestion at the cursor of the current window (insert mode).
function M.trigger()
  if not M.config.completion.enabled then
    return
  end
  local buf = vim.api.nvim_get_current_buf()
  if vim.bo[buf].buftype ~= '' then
    return
  end
  local pos = vim.api.nvim_win_get_cursor(0)
  local row, col = pos[1] - 1, pos[2]
  M.connect(function(client)
    if not client then
      return
    end
    local cur = vim.api.nvim_win_get_cursor(0)
    if vim.api.nvim_get_current_buf() ~= buf or cur[1] - 1 ~= row or cur[2] ~= col then
      return -- moved while connecting
    end
    local req = M.build_request(buf, row, col)
    M.completer:complete(req, function(text)
      if not text or text == '' then
        return
      end
      local now = vim.api.nvim_win_get_cursor(0)
      if vim.api.nvim_get_current_buf() ~= buf or now[1] - 1 ~= row or now[2] ~= col
          or not vim.fn.mode():match('^i') then
        return
      end
      S.suggestion = { buf = buf, row = row, col = col, text = text }
      ghost.show(buf, row, col, text)
    end)
  end)
end

--- Remove the ghost text (the request in flight, if any, is cancelled too).
function M.dismiss()
  if S.suggestion then
    ghost.clear(S.suggestion.buf)
    S.suggestion = nil
  end
end

--- Insert `how` of the suggestion ('all', 'word' or 'line'); returns true when one was shown.
function M.accept(how)
  local s = S.suggestion
  if not s or not vim.api.nvim_buf_is_valid(s.buf) then
    return false
  end
  local text = s.text
  if how == 'word' then
    text = (accept.word(text))
  elseif how == 'line' then
    text = (accept.line(text))
  end
  M.dismiss()
  local lines = vim.split(text, '\n', { plain = true })
  vim.api.nvim_buf_set_text(s.buf, s.row, s.col, s.row, s.col, lines)
  local row = s.row + #lines - 1
  local col = #lines == 1 and s.col + #lines[1] or #lines[#lines]
  vim.api.nvim_win_set_cursor(0, { row + 1, col })
  return true
end

-- ---- context ring ----

local function note_place(buf, row)
  if vim.bo[buf].buftype ~= '' or vim.api.nvim_buf_get_name(buf) == '' then
    return
  end
  local lines = vim.api.nvim_buf_get_lines(buf, 0, -1, false)
  M.ring:add_around(Docs.uri(buf), lines, row)
end
M.note_place = note_place

-- ---- setup ----

local function map_key(lhs, how)
  if not lhs or lhs == '' then
    return
  end
  vim.keymap.set('i', lhs, function()
    if S.suggestion and M.accept(how) then
      return
    end
    vim.api.nvim_feedkeys(vim.api.nvim_replace_termcodes(lhs, true, false, true), 'n', false)
  end, { desc = 'spark: accept ' .. how })
end

function M.setup(opts)
  M.config = vim.tbl_deep_extend('force', vim.deepcopy(M.defaults), opts or {})
  local c = M.config
  M.ring = Ring.new({ max_chunks = c.context.max_chunks, chunk_lines = c.context.chunk_lines })
  M.completer = Completer.new({ fetch = fetch, cache = Cache.new(),
                                delay_ms = c.completion.debounce_ms })
  map_key(c.keys.accept, 'all')
  map_key(c.keys.accept_word, 'word')
  map_key(c.keys.accept_line, 'line')
  if c.keys.dismiss and c.keys.dismiss ~= '' then
    vim.keymap.set('i', c.keys.dismiss, function()
      M.completer:supersede()
      M.dismiss()
    end, { desc = 'spark: dismiss' })
  end
  local group = vim.api.nvim_create_augroup('spark', { clear = true })
  local au = function(ev, fn)
    vim.api.nvim_create_autocmd(ev, { group = group, callback = fn })
  end
  au({ 'TextChangedI', 'InsertEnter' }, function()
    M.dismiss()
    M.trigger()
  end)
  au('CursorMovedI', function()
    local s = S.suggestion
    if s then
      local p = vim.api.nvim_win_get_cursor(0)
      if p[1] - 1 ~= s.row or p[2] ~= s.col then
        M.dismiss()
      end
    end
  end)
  au('InsertLeave', function()
    M.completer:supersede()
    M.dismiss()
  end)
  au({ 'BufLeave', 'BufWritePost' }, function(ev)
    note_place(ev.buf, vim.api.nvim_win_get_cursor(0)[1] - 1)
  end)
  au('CursorHold', function(ev)
    local row = vim.api.nvim_win_get_cursor(0)[1] - 1
    local p = S.last_place
    if p and p.buf == ev.buf and math.abs(p.row - row) > c.context.chunk_lines then
      note_place(p.buf, p.row)
    end
    S.last_place = { buf = ev.buf, row = row }
  end)
  au('TextYankPost', function(ev)
    local lines = vim.v.event.regcontents
    if vim.api.nvim_buf_get_name(ev.buf) ~= '' and #lines >= 3 then
      local start = vim.api.nvim_buf_get_mark(ev.buf, '[')[1] - 1
      M.ring:add(Docs.uri(ev.buf), start, lines)
    end
  end)
  au('BufDelete', function(ev)
    M.ring:drop_uri(Docs.uri(ev.buf))
    if S.docs then
      S.docs:close(ev.buf)
    end
  end)
  au('VimLeavePre', function()
    if S.client then
      S.client:close()
    end
    M.stop_server()
  end)
  if c.auto_connect then
    vim.defer_fn(function() M.connect() end, 0)
  end
end

-- ---- server process ----

function M.start_server()
  if S.server_job then
    return notify('the server is already running')
  end
  local host, port = require('spark.ws').parse_url(M.config.url)
  if not host then
    return notify(port, vim.log.levels.ERROR)
  end
  local cmd = vim.deepcopy(M.config.server_cmd)
  -- the server we start dies with this Neovim, also when it is killed or crashes (the
  -- VimLeavePre stop below covers only a clean exit): the server watches its parent and the
  -- stdin pipe the job holds
  vim.list_extend(cmd, { '--host', host, '--port', tostring(port), '--exit-with-parent' })
  if M.config.model ~= '' then
    vim.list_extend(cmd, { '-m', M.config.model })
  end
  local ok, job = pcall(vim.fn.jobstart, cmd, {
    on_exit = function(_, code)
      S.server_job = nil
      notify('server exited (' .. code .. ')')
    end,
  })
  if not ok or job <= 0 then
    return notify('cannot start ' .. cmd[1], vim.log.levels.ERROR)
  end
  S.server_job = job
  local tries = 0
  local function try()
    tries = tries + 1
    M.connect(function(client)
      if client then
        return notify('connected to ' .. S.model)
      end
      if tries < 50 and S.server_job then
        vim.defer_fn(try, 200)
      end
    end)
  end
  vim.defer_fn(try, 200)
end

function M.stop_server()
  if S.client then
    S.client:shutdown()
  end
  if S.server_job then
    vim.fn.jobstop(S.server_job)
    S.server_job = nil
  end
end

return M
