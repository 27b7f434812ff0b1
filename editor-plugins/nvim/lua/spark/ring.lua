-- Context chunks from other files (the strategy of the VS Code extension's context.js, after
-- llama.vim): line chunks of recently viewed and edited places, the newest last; a chunk that
-- mostly repeats an older one (Dice coefficient of their non-blank line sets above `similar`)
-- replaces it; the oldest leave when the ring is full; a request takes the newest that fit a
-- byte budget, leaving out chunks of the current file that overlap the request's own window.
local Ring = {}
Ring.__index = Ring

local function line_set(lines)
  local s, n = {}, 0
  for _, l in ipairs(lines) do
    local t = vim.trim(l)
    if #t > 0 and not s[t] then
      s[t] = true
      n = n + 1
    end
  end
  return s, n
end

local function similarity(a, an, b, bn)
  if an == 0 and bn == 0 then
    return 1
  end
  local common = 0
  for l in pairs(an <= bn and a or b) do
    if (an <= bn and b or a)[l] then
      common = common + 1
    end
  end
  return 2 * common / (an + bn)
end

Ring.line_set = line_set
Ring.similarity = similarity

--- opts: max_chunks (16), chunk_lines (64), min_lines (3), similar (0.9).
function Ring.new(opts)
  opts = opts or {}
  return setmetatable({
    max_chunks = opts.max_chunks or 16,
    chunk_lines = opts.chunk_lines or 64,
    min_lines = opts.min_lines or 3,
    similar = opts.similar or 0.9,
    chunks = {}, -- { uri, start (0-based line), text, nlines, set, n }, oldest first
    evicted = 0,
  }, Ring)
end

--- Add lines of `uri` starting at 0-based line `start`. Returns 'added', 'refreshed',
--- 'replaced' or 'ignored' (as the VS Code ring).
function Ring:add(uri, start, lines)
  local set, n = line_set(lines)
  if n < self.min_lines then
    return 'ignored'
  end
  local text = table.concat(lines, '\n')
  for i, c in ipairs(self.chunks) do
    if c.text == text then
      table.remove(self.chunks, i)
      c.uri, c.start = uri, start
      table.insert(self.chunks, c)
      return 'refreshed'
    end
  end
  local kept, replaced = {}, false
  for _, c in ipairs(self.chunks) do
    if similarity(c.set, c.n, set, n) > self.similar then
      replaced = true
      self.evicted = self.evicted + 1
    else
      kept[#kept + 1] = c
    end
  end
  kept[#kept + 1] = { uri = uri, start = start, text = text, nlines = #lines, set = set, n = n }
  while #kept > self.max_chunks do
    table.remove(kept, 1)
    self.evicted = self.evicted + 1
  end
  self.chunks = kept
  return replaced and 'replaced' or 'added'
end

--- Add `chunk_lines` lines of `all` (a list of lines) centred on 0-based `line`.
function Ring:add_around(uri, all, line)
  local n = self.chunk_lines
  local start = math.max(0, math.min(line - math.floor(n / 2), #all - n))
  local lines = {}
  for i = start + 1, math.min(#all, start + n) do
    lines[#lines + 1] = all[i]
  end
  return self:add(uri, start, lines)
end

--- Chunks for a request in `uri` whose window is lines [win_start, win_end): the newest that
--- fit `budget` bytes, oldest first, as { uri, start, text }.
function Ring:take(uri, win_start, win_end, budget)
  local out, used = {}, 0
  for i = #self.chunks, 1, -1 do
    local c = self.chunks[i]
    local overlaps = c.uri == uri and c.start < win_end and c.start + c.nlines > win_start
    if not overlaps and used + #c.text <= budget then
      used = used + #c.text
      table.insert(out, 1, { uri = c.uri, start = c.start, text = c.text })
    end
  end
  return out
end

function Ring:drop_uri(uri)
  local kept = {}
  for _, c in ipairs(self.chunks) do
    if c.uri ~= uri then
      kept[#kept + 1] = c
    end
  end
  self.chunks = kept
end

function Ring:size()
  return #self.chunks
end

return Ring
