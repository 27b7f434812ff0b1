-- Document sync (docs/protocol.md section 4): buffers are opened on the server on first use and
-- kept in step with nvim_buf_attach line events as whole-line incremental changes (a change
-- of lines [first, last) becomes a range from (first, 0) to (last, 0), so no column conversion
-- is needed in either position encoding). The document text is the buffer's lines each ended by
-- "\n". A document the server dropped (-32010) is reopened with its full text.
local codes = require('spark.rpc').codes

local Docs = {}
Docs.__index = Docs

function Docs.new(client)
  return setmetatable({ client = client, open = {}, count = 0 }, Docs)
end

local function buf_text(buf)
  local lines = vim.api.nvim_buf_get_lines(buf, 0, -1, false)
  return table.concat(lines, '\n') .. '\n'
end
Docs.buf_text = buf_text

function Docs.uri(buf)
  local name = vim.api.nvim_buf_get_name(buf)
  if name == '' then
    return 'untitled:' .. buf
  end
  return vim.uri_from_fname(vim.fn.fnamemodify(name, ':p'))
end

function Docs:_send_open(buf, d)
  self.client:notify('textDocument/didOpen', { textDocument = {
    uri = d.uri, languageId = vim.bo[buf].filetype ~= '' and vim.bo[buf].filetype or 'text',
    version = vim.api.nvim_buf_get_changedtick(buf), text = buf_text(buf) } })
end

--- Make sure `buf` is open on the server; returns its URI.
function Docs:ensure(buf)
  local d = self.open[buf]
  if d then
    return d.uri
  end
  d = { uri = Docs.uri(buf) }
  self.open[buf] = d
  self.count = self.count + 1
  self:_send_open(buf, d)
  vim.api.nvim_buf_attach(buf, false, {
    on_lines = function(_, b, tick, first, last, new_last)
      if self.open[b] ~= d or self.client.closed then
        return true -- detach
      end
      local lines = vim.api.nvim_buf_get_lines(b, first, new_last, false)
      local text = #lines > 0 and (table.concat(lines, '\n') .. '\n') or ''
      self.client:notify('textDocument/didChange', {
        textDocument = { uri = d.uri, version = tick },
        contentChanges = { { range = { start = { line = first, character = 0 },
                                       ['end'] = { line = last, character = 0 } },
                             text = text } } })
    end,
    on_reload = function(_, b)
      if self.open[b] == d then
        self.client:notify('textDocument/didChange', {
          textDocument = { uri = d.uri, version = vim.api.nvim_buf_get_changedtick(b) },
          contentChanges = { { text = buf_text(b) } } })
      end
    end,
    on_detach = function(_, b)
      if self.open[b] == d then
        self:close(b)
      end
    end,
  })
  return d.uri
end

function Docs:close(buf)
  local d = self.open[buf]
  if not d then
    return
  end
  self.open[buf] = nil
  self.count = self.count - 1
  self.client:notify('textDocument/didClose', { textDocument = { uri = d.uri } })
end

--- Send request `method` about `buf`; reopen it once on DocumentNotOpen. cb(result, err).
--- Returns a cancel function.
function Docs:request(buf, method, params, cb)
  local cancelled = false
  local cancel -- declared first: the retry below replaces it
  local _
  _, cancel = self.client:request(method, params, function(r, err)
    if err and err.code == codes.DocumentNotOpen and not cancelled and self.open[buf]
        and vim.api.nvim_buf_is_valid(buf) then
      self:_send_open(buf, self.open[buf])
      local _, c2 = self.client:request(method, params, cb)
      cancel = c2
      return
    end
    cb(r, err)
  end)
  return function()
    cancelled = true
    cancel()
  end
end

return Docs
