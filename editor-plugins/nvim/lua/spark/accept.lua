-- Partial acceptance of a suggestion (the same rules as the VS Code extension's accept.js):
-- word() and line() return accepted, rest with accepted .. rest == text. Text is UTF-8: bytes
-- >= 0x80 count as word characters, so a multi-byte letter is never split.
local M = {}

local function is_word(c)
  return c:match('[%w_$]') ~= nil or c:byte() >= 0x80
end

local function is_blank(c)
  return c == ' ' or c == '\t'
end

local function is_space(c)
  return c:match('%s') ~= nil
end

--- The next word: a leading line break, blanks, then a run of word characters or else a run of
--- other non-blank characters.
function M.word(text)
  local n = #text
  local i = 1
  if text:sub(1, 2) == '\r\n' then
    i = 3
  elseif text:sub(1, 1) == '\n' then
    i = 2
  end
  while i <= n and is_blank(text:sub(i, i)) do
    i = i + 1
  end
  if i <= n and is_word(text:sub(i, i)) then
    while i <= n and is_word(text:sub(i, i)) do
      i = i + 1
    end
  else
    while i <= n and not is_word(text:sub(i, i)) and not is_space(text:sub(i, i)) do
      i = i + 1
    end
  end
  if i == 1 and n > 0 then
    i = 2
  end
  return text:sub(1, i - 1), text:sub(i)
end

--- The next line: up to the first line break after some text; a leading break and the whole
--- next line when the suggestion starts with one.
function M.line(text)
  local i = 1
  if text:sub(1, 2) == '\r\n' then
    i = 3
  elseif text:sub(1, 1) == '\n' then
    i = 2
  end
  local nl = text:find('\n', i, true)
  local e = nl and nl - 1 or #text
  if e >= i and text:sub(e, e) == '\r' then
    e = e - 1
  end
  return text:sub(1, e), text:sub(e + 1)
end

return M
