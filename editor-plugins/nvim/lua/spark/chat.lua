-- The chat buffer: a scratch buffer showing the conversation; answers stream into it as
-- chat/delta notifications arrive. :SparkChat [message] opens it (and sends the message);
-- in the buffer, <CR> asks for a message and q closes the window, <C-c> stops the answer.
local M = {}

M.messages = {}
M.buf = nil
M.cancel = nil
M.busy = false

local function spark()
  return require('spark')
end

local function ensure_buf()
  if M.buf and vim.api.nvim_buf_is_valid(M.buf) then
    return M.buf
  end
  local buf = vim.api.nvim_create_buf(false, true)
  vim.api.nvim_buf_set_name(buf, 'spark://chat')
  vim.bo[buf].filetype = 'markdown'
  vim.bo[buf].bufhidden = 'hide'
  vim.keymap.set('n', '<CR>', function()
    vim.ui.input({ prompt = 'spark> ' }, function(text)
      if text and text ~= '' then
        M.send(text)
      end
    end)
  end, { buffer = buf, desc = 'spark: send a chat message' })
  vim.keymap.set('n', '<C-c>', function() M.stop() end, { buffer = buf })
  vim.keymap.set('n', 'q', '<Cmd>close<CR>', { buffer = buf })
  M.buf = buf
  return buf
end

--- Open the chat window (a split on the right) and return its buffer.
function M.open()
  local buf = ensure_buf()
  for _, win in ipairs(vim.api.nvim_list_wins()) do
    if vim.api.nvim_win_get_buf(win) == buf then
      return buf
    end
  end
  vim.cmd('botright vsplit')
  vim.api.nvim_win_set_buf(0, buf)
  return buf
end

--- Append text to the end of the buffer (newlines start new lines).
local function append(buf, text)
  local last = vim.api.nvim_buf_line_count(buf)
  local tail = vim.api.nvim_buf_get_lines(buf, last - 1, last, false)[1] or ''
  local parts = vim.split(text, '\n', { plain = true })
  parts[1] = tail .. parts[1]
  vim.api.nvim_buf_set_lines(buf, last - 1, last, false, parts)
  for _, win in ipairs(vim.api.nvim_list_wins()) do
    if vim.api.nvim_win_get_buf(win) == buf then
      vim.api.nvim_win_set_cursor(win, { vim.api.nvim_buf_line_count(buf), 0 })
    end
  end
end
M.append = append

--- Send `text` as the next user message; the answer streams into the buffer. on_done(result,
--- err) is called at the end (tests use it).
function M.send(text, on_done)
  local buf = ensure_buf()
  if M.busy then
    vim.notify('spark: an answer is still streaming (<C-c> stops it)', vim.log.levels.WARN)
    return
  end
  M.busy = true
  local first = vim.api.nvim_buf_line_count(buf) == 1
      and vim.api.nvim_buf_get_lines(buf, 0, 1, false)[1] == ''
  append(buf, (first and '' or '\n\n') .. '## You\n' .. text .. '\n\n## Assistant\n')
  spark().connect(function(client, err)
    if not client then
      M.busy = false
      append(buf, '(not connected: ' .. tostring(err) .. ')')
      if on_done then on_done(nil, { message = err }) end
      return
    end
    local cfg = spark().config.chat
    local user = { role = 'user', content = text }
    local msgs = vim.deepcopy(M.messages)
    msgs[#msgs + 1] = user
    local calls = {}
    local _, cancel = client:request('chat/completion',
      { messages = msgs, temperature = cfg.temperature, max_tokens = cfg.max_tokens },
      function(r, rerr)
        M.busy, M.cancel = false, nil
        if rerr then
          local partial = rerr.data and rerr.data.message
          if rerr.code == require('spark.rpc').codes.RequestCancelled then
            append(buf, '\n(stopped)')
            M.messages[#M.messages + 1] = user
            M.messages[#M.messages + 1] = partial or { role = 'assistant', content = '' }
          else
            append(buf, '\n(error: ' .. tostring(rerr.message) .. ')')
          end
        else
          M.messages[#M.messages + 1] = user
          M.messages[#M.messages + 1] = r.message
          if r.usage and r.usage.tokensPerSecond then
            spark().state.tps = r.usage.tokensPerSecond
          end
        end
        if on_done then on_done(r, rerr) end
      end,
      function(_, p)
        if p.content then
          append(buf, p.content)
        elseif p.toolCall then
          local t = p.toolCall
          if not calls[t.index] then
            calls[t.index] = true
            append(buf, '\n[tool call ' .. (t.name or '?') .. '] ')
          end
          append(buf, t.arguments or '')
        end
      end)
    M.cancel = cancel
  end)
end

function M.stop()
  if M.cancel then
    M.cancel()
  end
end

function M.reset()
  M.messages = {}
  if M.buf and vim.api.nvim_buf_is_valid(M.buf) then
    vim.api.nvim_buf_set_lines(M.buf, 0, -1, false, { '' })
  end
end

return M
