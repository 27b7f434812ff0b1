-- Ghost text: the suggestion drawn with extmarks at the cursor. Neovim 0.10+ draws the first
-- line inline (virt_text_pos = 'inline'), pushing the rest of the line right; older versions
-- (Debian 12's 0.7) overlay it when the cursor is at the end of the line and put it after the
-- line's end otherwise, so existing text is never hidden. Further lines are virt_lines.
local M = {}

M.ns = vim.api.nvim_create_namespace('spark_ghost')
M.has_inline = vim.fn.has('nvim-0.10') == 1
M.hl = 'SparkGhost'

vim.api.nvim_set_hl(0, M.hl, { link = 'Comment', default = true })

--- Show `text` at (row, col) (0-based row, byte col) in `buf`; replaces what was shown.
--- Returns the extmark id.
function M.show(buf, row, col, text)
  M.clear(buf)
  local lines = vim.split(text, '\n', { plain = true })
  local line = vim.api.nvim_buf_get_lines(buf, row, row + 1, false)[1] or ''
  local opts = { hl_mode = 'combine' }
  if lines[1] ~= '' then
    if M.has_inline then
      opts.virt_text_pos = 'inline'
    elseif col >= #line then
      opts.virt_text_pos = 'overlay'
    else
      opts.virt_text_pos = 'eol'
    end
    opts.virt_text = { { lines[1], M.hl } }
  end
  if #lines > 1 then
    local vl = {}
    for i = 2, #lines do
      vl[#vl + 1] = { { lines[i] == '' and ' ' or lines[i], M.hl } }
    end
    opts.virt_lines = vl
  end
  col = math.min(col, #line)
  return vim.api.nvim_buf_set_extmark(buf, M.ns, row, col, opts)
end

function M.clear(buf)
  if vim.api.nvim_buf_is_valid(buf) then
    vim.api.nvim_buf_clear_namespace(buf, M.ns, 0, -1)
  end
end

--- What is shown in `buf`: { row, col, text } or nil (read back from the extmark, for tests).
function M.shown(buf)
  local marks = vim.api.nvim_buf_get_extmarks(buf, M.ns, 0, -1, { details = true })
  if #marks == 0 then
    return nil
  end
  local m = marks[1]
  local d = m[4]
  local parts = {}
  parts[1] = d.virt_text and d.virt_text[1][1] or ''
  for _, vl in ipairs(d.virt_lines or {}) do
    parts[#parts + 1] = vl[1][1] == ' ' and '' or vl[1][1]
  end
  return { row = m[2], col = m[3], text = table.concat(parts, '\n') }
end

return M
