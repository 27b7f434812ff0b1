-- Debounce, stale-request cancellation and the cache in front of the completion request (the
-- same behaviour as the VS Code extension's completer.js). Each call supersedes the previous:
-- one still waiting out the delay is answered nil without a request, one in flight is cancelled
-- ($/cancelRequest); a cache hit (typing through a suggestion) answers at once.
local Cache = require('spark.cache')

local Completer = {}
Completer.__index = Completer

local function real_timers()
  return {
    start = function(ms, fn)
      local t = vim.loop.new_timer()
      t:start(ms, 0, vim.schedule_wrap(function()
        if not t:is_closing() then
          t:close()
        end
        fn()
      end))
      return t
    end,
    stop = function(t)
      if not t:is_closing() then
        t:stop()
        t:close()
      end
    end,
  }
end

--- opts.fetch(req, done) sends a request; it calls done(text or nil, err) once and returns a
--- cancel function. opts.cache, opts.delay_ms (120), opts.timers ({start(ms, fn), stop(t)}).
function Completer.new(opts)
  return setmetatable({
    fetch = opts.fetch,
    cache = opts.cache or Cache.new(),
    delay_ms = opts.delay_ms or 120,
    timers = opts.timers or real_timers(),
    pending = nil, -- { timer, cb, req }
    inflight = nil, -- { cancel, cb }
    stats = { calls = 0, cache_hits = 0, debounced = 0, sent = 0, cancelled = 0,
              completed = 0, errors = 0 },
    last_error = nil,
  }, Completer)
end

--- Ask for the suggestion for `req` (req.prefix and req.suffix key the cache); cb(text) gets it,
--- or nil when superseded, empty or failed (last_error says why). cb may run before this returns
--- (cache hit).
function Completer:complete(req, cb)
  self.stats.calls = self.stats.calls + 1
  self:supersede()
  local hit = self.cache:get(req.prefix, req.suffix)
  if hit then
    self.stats.cache_hits = self.stats.cache_hits + 1
    return cb(hit)
  end
  local p = { req = req, cb = cb }
  p.timer = self.timers.start(self.delay_ms, function()
    if self.pending ~= p then
      return
    end
    self.pending = nil
    self:_send(req, cb)
  end)
  self.pending = p
end

function Completer:_send(req, cb)
  self.stats.sent = self.stats.sent + 1
  local entry = { cb = cb }
  self.inflight = entry
  entry.cancel = self.fetch(req, function(text, err)
    if type(text) == 'string' then
      self.cache:put(req.prefix, req.suffix, text)
    end
    if self.inflight ~= entry then
      if type(text) == 'string' then
        self:_serve_pending()
      end
      return
    end
    self.inflight = nil
    if err then
      self.stats.errors = self.stats.errors + 1
      self.last_error = err
      return cb(nil)
    end
    self.stats.completed = self.stats.completed + 1
    cb(text ~= nil and #text > 0 and text or nil)
  end)
end

--- A late answer filled the cache: the call waiting out its delay may be served from it.
function Completer:_serve_pending()
  local p = self.pending
  if not p then
    return
  end
  local hit = self.cache:get(p.req.prefix, p.req.suffix)
  if not hit then
    return
  end
  self.timers.stop(p.timer)
  self.pending = nil
  self.stats.cache_hits = self.stats.cache_hits + 1
  p.cb(hit)
end

--- Drop the waiting call and cancel the one in flight.
function Completer:supersede()
  local p = self.pending
  if p then
    self.pending = nil
    self.timers.stop(p.timer)
    self.stats.debounced = self.stats.debounced + 1
    p.cb(nil)
  end
  local f = self.inflight
  if f then
    self.inflight = nil
    self.stats.cancelled = self.stats.cancelled + 1
    if f.cancel then
      f.cancel()
    end
    f.cb(nil)
  end
end

return Completer
