-- :SparkAgent {task}: runs the agent on the current working directory (the workspace folder
-- given at initialize), streaming its events into a scratch buffer; approvals open a floating
-- window: y approves, n / q / <Esc> deny.
local M = {}

M.buf = nil
M.run = nil -- { id, cancel }
M.approve_default = nil -- tests set a function(params) -> bool instead of the float

local function spark()
  return require('spark')
end

local append = function(buf, text)
  require('spark.chat').append(buf, text)
end

local function ensure_buf()
  if M.buf and vim.api.nvim_buf_is_valid(M.buf) then
    return M.buf
  end
  local buf = vim.api.nvim_create_buf(false, true)
  vim.api.nvim_buf_set_name(buf, 'spark://agent')
  vim.bo[buf].filetype = 'markdown'
  vim.bo[buf].bufhidden = 'hide'
  vim.keymap.set('n', '<C-c>', function() M.stop() end, { buffer = buf })
  vim.keymap.set('n', 'q', '<Cmd>close<CR>', { buffer = buf })
  M.buf = buf
  return buf
end

local function show(ev)
  local buf = ensure_buf()
  local t = ev.type
  if t == 'text' then
    append(buf, ev.text)
  elseif t == 'assistant' then
    append(buf, '\n')
  elseif t == 'tool_call' then
    append(buf, string.format('\n> %s %s %s\n', ev.decision == 'deny' and 'denied' or 'call',
      ev.name, ev.arguments))
  elseif t == 'tool_result' then
    local content = ev.content or ''
    if #content > 400 then
      content = content:sub(1, 400) .. ' ...'
    end
    append(buf, string.format('< %s %s: %s\n', ev.ok and 'ok' or 'failed', ev.name, content))
  elseif t == 'diff' then
    append(buf, '```diff\n' .. ev.diff .. (ev.diff:sub(-1) == '\n' and '' or '\n') .. '```\n')
  elseif t == 'refused' or t == 'invalid_call' then
    append(buf, string.format('! %s %s: %s\n', t, ev.name or '?', ev.content or ''))
  elseif t == 'stop' then
    append(buf, string.format('\n-- stopped: %s (%d steps, %d tool calls)\n', ev.reason,
      ev.steps or 0, ev.tool_calls or 0))
  end
end

--- Run `task`; on_done(result, err) at the end (tests use it).
function M.start(task, on_done)
  if M.run then
    return vim.notify('spark: an agent run is active (:SparkAgentStop)', vim.log.levels.WARN)
  end
  local buf = ensure_buf()
  local shown = false
  for _, win in ipairs(vim.api.nvim_list_wins()) do
    shown = shown or vim.api.nvim_win_get_buf(win) == buf
  end
  if not shown then
    vim.cmd('botright split')
    vim.api.nvim_win_set_buf(0, buf)
  end
  append(buf, '\n# ' .. task .. '\n')
  local root = vim.loop.cwd()
  spark().connect_for_root(root, function(client, err)
    if not client then
      append(buf, '(not connected: ' .. tostring(err) .. ')\n')
      if on_done then on_done(nil, { message = err }) end
      return
    end
    local id, cancel = client:request('agent/run', {
      root = vim.uri_from_fname(root), task = task,
      approval = spark().config.agent.approval,
    }, function(r, rerr)
      M.run = nil
      local result = r or (rerr and rerr.data)
      if result and result.stop then
        append(buf, '\n' .. (result.answer or result.message or '') .. '\n')
      elseif rerr then
        append(buf, '(error: ' .. tostring(rerr.message) .. ')\n')
      end
      if on_done then on_done(result, not (result and result.stop) and rerr or nil) end
    end, function(_, p)
      show(p.event)
    end)
    M.run = { id = id, cancel = cancel }
  end)
end

function M.stop()
  if M.run then
    M.run.cancel()
  end
end

--- agent/approval from the server: ask in a floating window, reply({approved = bool}).
function M.on_approval(params, reply)
  if M.approve_default then
    return reply({ approved = M.approve_default(params) == true })
  end
  local lines = { string.format('Allow %s: %s?', params.kind or 'call', params.tool or '?'), '' }
  for _, l in ipairs(vim.split(params.arguments or '', '\n', { plain = true })) do
    lines[#lines + 1] = l
  end
  lines[#lines + 1] = ''
  lines[#lines + 1] = '[y] approve   [n] deny'
  local buf = vim.api.nvim_create_buf(false, true)
  vim.api.nvim_buf_set_lines(buf, 0, -1, false, lines)
  local width = 20
  for _, l in ipairs(lines) do
    width = math.max(width, vim.fn.strdisplaywidth(l))
  end
  width = math.min(width + 2, vim.o.columns - 4)
  local height = math.min(#lines, vim.o.lines - 4)
  local win = vim.api.nvim_open_win(buf, true, {
    relative = 'editor', style = 'minimal', border = 'rounded',
    width = width, height = height,
    row = math.floor((vim.o.lines - height) / 2), col = math.floor((vim.o.columns - width) / 2),
  })
  local done = false
  local function answer(ok)
    if done then
      return
    end
    done = true
    if vim.api.nvim_win_is_valid(win) then
      vim.api.nvim_win_close(win, true)
    end
    reply({ approved = ok })
  end
  vim.keymap.set('n', 'y', function() answer(true) end, { buffer = buf })
  for _, k in ipairs({ 'n', 'q', '<Esc>' }) do
    vim.keymap.set('n', k, function() answer(false) end, { buffer = buf })
  end
  vim.api.nvim_create_autocmd('BufWipeout', { buffer = buf, once = true,
    callback = function() answer(false) end })
  M.approval_win = win
end

return M
