-- Completion cache (the same strategy as the VS Code extension's cache.js): entries keyed by a
-- window of the prefix and suffix around the cursor; a lookup walks back over the characters
-- typed since a cached request, so typing through a suggestion never asks the server again.
local Cache = {}
Cache.__index = Cache

--- opts: max_entries (256), prefix_window (2048 bytes), suffix_window (512 bytes).
function Cache.new(opts)
  opts = opts or {}
  return setmetatable({
    max_entries = opts.max_entries or 256,
    prefix_window = opts.prefix_window or 2048,
    suffix_window = opts.suffix_window or 512,
    map = {}, -- key -> { text, tick }
    count = 0,
    tick = 0,
    longest = 0,
  }, Cache)
end

function Cache:key(prefix, suffix)
  local p = #prefix > self.prefix_window and prefix:sub(-self.prefix_window) or prefix
  return p .. '\0' .. suffix:sub(1, self.suffix_window)
end

function Cache:_touch(e)
  self.tick = self.tick + 1
  e.tick = self.tick
end

function Cache:put(prefix, suffix, text)
  if type(text) ~= 'string' then
    return
  end
  local k = self:key(prefix, suffix)
  if not self.map[k] then
    self.count = self.count + 1
  end
  local e = { text = text }
  self.map[k] = e
  self:_touch(e)
  if #text > self.longest then
    self.longest = #text
  end
  if self.count > self.max_entries then
    -- drop the least recently used entry (a scan: puts are rare next to lookups)
    local old_k, old_t
    for key, v in pairs(self.map) do
      if not old_t or v.tick < old_t then
        old_k, old_t = key, v.tick
      end
    end
    self.map[old_k] = nil
    self.count = self.count - 1
  end
end

--- The suggestion for the cursor between prefix and suffix, or nil.
function Cache:get(prefix, suffix)
  local e = self.map[self:key(prefix, suffix)]
  if e then
    self:_touch(e)
    return e.text
  end
  for back = 1, math.min(self.longest, #prefix) do
    local typed = prefix:sub(-back)
    local c = self.map[self:key(prefix:sub(1, #prefix - back), suffix)]
    if c and #c.text > back and c.text:sub(1, back) == typed then
      self:_touch(c)
      return c.text:sub(back + 1)
    end
  end
  return nil
end

function Cache:clear()
  self.map, self.count, self.longest = {}, 0, 0
end

return Cache
