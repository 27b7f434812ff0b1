-- Unit tests of the Neovim plugin's client-side logic: accept word/line, the completion cache,
-- the context ring, the debouncing completer, SHA-1/base64 and the WebSocket frame codec.
local T = require('harness')
local accept = require('spark.accept')
local Cache = require('spark.cache')
local Ring = require('spark.ring')
local Completer = require('spark.completer')
local sha1 = require('spark.sha1')
local ws = require('spark.ws')

local function split(fn, text)
  local a, r = fn(text)
  return { a, r }
end

T.test('accept word', function()
  T.eq(split(accept.word, 'foo(bar)'), { 'foo', '(bar)' })
  T.eq(split(accept.word, '(bar)'), { '(', 'bar)' })
  T.eq(split(accept.word, '  return x;'), { '  return', ' x;' })
  T.eq(split(accept.word, ' += 1'), { ' +=', ' 1' })
  T.eq(split(accept.word, '\n    int y;'), { '\n    int', ' y;' })
  T.eq(split(accept.word, 'größe = 1'), { 'größe', ' = 1' })
  T.eq(split(accept.word, ''), { '', '' })
  local t, acc = 'if (a &&  b) {\n\treturn c_2;\n}', ''
  for _ = 1, 100 do
    if t == '' then break end
    local a, r = accept.word(t)
    T.ok(#a > 0, 'progress')
    acc, t = acc .. a, r
  end
  T.eq(acc, 'if (a &&  b) {\n\treturn c_2;\n}')
end)

T.test('accept line', function()
  T.eq(split(accept.line, 'a = 1;\nb = 2;'), { 'a = 1;', '\nb = 2;' })
  T.eq(split(accept.line, '\nb = 2;\nc'), { '\nb = 2;', '\nc' })
  T.eq(split(accept.line, 'x\r\ny'), { 'x', '\r\ny' })
  T.eq(split(accept.line, 'last'), { 'last', '' })
  T.eq(split(accept.line, ''), { '', '' })
end)

T.test('cache: exact, typing through, typed past the end, mismatch', function()
  local c = Cache.new()
  c:put('int main(', ') {}', 'void')
  T.eq(c:get('int main(', ') {}'), 'void')
  T.eq(c:get('int main(v', ') {}'), 'oid')
  T.eq(c:get('int main(voi', ') {}'), 'd')
  T.eq(c:get('int main(void', ') {}'), nil)
  T.eq(c:get('int main(x', ') {}'), nil)
  T.eq(c:get('int main(v', ') {} '), nil)
  T.eq(c:get('int main', ') {}'), nil)
end)

T.test('cache: nearest entry wins, LRU bound, windows', function()
  local c = Cache.new({ max_entries = 2 })
  c:put('a', '', 'bcdef')
  c:put('abc', '', 'XYZ')
  T.eq(c:get('abcX', ''), 'YZ')
  T.eq(c:get('abcd', ''), 'ef')
  c:get('a', '')
  c:put('q', '', 'r')
  T.eq(c.count, 2)
  T.eq(c:get('abc', ''), 'def')
  T.eq(c:get('q', ''), 'r')
  local w = Cache.new({ prefix_window = 4, suffix_window = 2 })
  w:put('xxxxabcd', 'efyyyy', 'T')
  T.eq(w:get('zzabcd', 'efzz'), 'T')
  T.eq(w:get('zzabce', 'efzz'), nil)
end)

local function lines(tag, n)
  local t = {}
  for i = 0, n - 1 do
    t[#t + 1] = string.format('%s line %d;', tag, i)
  end
  return t
end

local function uris(r)
  local t = {}
  for _, c in ipairs(r.chunks) do
    t[#t + 1] = c.uri
  end
  return t
end

T.test('ring: dedup, similar replaces, capacity', function()
  local a, an = Ring.line_set({ '  int a;', '', 'int b;', 'int a;' })
  T.eq(an, 2)
  T.eq(Ring.similarity(a, an, a, an), 1)
  local r = Ring.new({ max_chunks = 3 })
  T.eq(r:add('a.c', 0, { 'x', '', 'y' }), 'ignored')
  T.eq(r:add('a.c', 0, lines('A', 10)), 'added')
  T.eq(r:add('b.c', 0, lines('B', 30)), 'added')
  T.eq(r:add('a.c', 0, lines('A', 10)), 'refreshed')
  T.eq(uris(r), { 'b.c', 'a.c' })
  local b2 = lines('B', 30)
  b2[6] = 'changed;'
  T.eq(r:add('b.c', 0, b2), 'replaced')
  r:add('c.c', 0, lines('C', 10))
  r:add('d.c', 0, lines('D', 10))
  T.eq(uris(r), { 'b.c', 'c.c', 'd.c' })
  r:drop_uri('c.c')
  T.eq(uris(r), { 'b.c', 'd.c' })
end)

T.test('ring: take skips the window, honours the budget', function()
  local r = Ring.new({ max_chunks = 8, chunk_lines = 4 })
  local doc = lines('M', 40)
  r:add_around('main.c', doc, 2)
  r:add_around('main.c', doc, 30)
  r:add('util.c', 10, lines('U', 4))
  r:add('big.c', 0, lines('BIG', 200))
  local function ids(list)
    local t = {}
    for _, c in ipairs(list) do
      t[#t + 1] = c.uri .. ':' .. c.start
    end
    return t
  end
  T.eq(ids(r:take('main.c', 0, 10, 1e9)), { 'main.c:28', 'util.c:10', 'big.c:0' })
  T.eq(ids(r:take('main.c', 0, 10, 200)), { 'main.c:28', 'util.c:10' })
  T.eq(ids(r:take('x.c', 0, 10, 0)), {})
end)

-- fake timers: fire only when the test advances the clock
local function fake_timers()
  local now, q = 0, {}
  return {
    start = function(ms, fn)
      local t = { at = now + ms, fn = fn }
      q[t] = true
      return t
    end,
    stop = function(t)
      q[t] = nil
    end,
    advance = function(ms)
      now = now + ms
      local due = {}
      for t in pairs(q) do
        if t.at <= now then
          due[#due + 1] = t
        end
      end
      table.sort(due, function(x, y) return x.at < y.at end)
      for _, t in ipairs(due) do
        q[t] = nil
        t.fn()
      end
    end,
  }
end

local function fake_server()
  local s = { calls = {} }
  s.fetch = function(req, done)
    local call = { req = req, done = done, cancelled = false }
    s.calls[#s.calls + 1] = call
    return function() call.cancelled = true end
  end
  return s
end

T.test('completer: debounce drops intermediate keystrokes', function()
  local t, s = fake_timers(), fake_server()
  local c = Completer.new({ fetch = s.fetch, delay_ms = 100, timers = t })
  local got = {}
  c:complete({ prefix = 'a', suffix = '' }, function(x) got[1] = x or false end)
  t.advance(50)
  c:complete({ prefix = 'ab', suffix = '' }, function(x) got[2] = x or false end)
  t.advance(50)
  c:complete({ prefix = 'abc', suffix = '' }, function(x) got[3] = x or false end)
  T.eq(got, { false, false })
  T.eq(#s.calls, 0)
  t.advance(100)
  T.eq(#s.calls, 1)
  T.eq(s.calls[1].req.prefix, 'abc')
  s.calls[1].done('def')
  T.eq(got[3], 'def')
  T.eq(c.stats, { calls = 3, cache_hits = 0, debounced = 2, sent = 1, cancelled = 0,
                  completed = 1, errors = 0 })
end)

T.test('completer: typing cancels the stale request; typing through hits the cache', function()
  local t, s = fake_timers(), fake_server()
  local c = Completer.new({ fetch = s.fetch, delay_ms = 10, timers = t })
  local r1, r2
  c:complete({ prefix = 'x = ', suffix = '' }, function(x) r1 = x or false end)
  t.advance(10)
  T.eq(#s.calls, 1)
  c:complete({ prefix = 'x = f', suffix = '' }, function(x) r2 = x or false end)
  T.eq(s.calls[1].cancelled, true)
  T.eq(r1, false)
  s.calls[1].done('foo(1)') -- a late answer fills the cache and serves the waiting call
  T.eq(r2, 'oo(1)')
  t.advance(10)
  T.eq(#s.calls, 1)
  local r3
  c:complete({ prefix = 'x = foo(', suffix = '' }, function(x) r3 = x end)
  T.eq(r3, '1)')
  T.eq(c.stats.cache_hits, 2)
  local r4 = 'unset'
  c:complete({ prefix = 'y', suffix = '' }, function(x) r4 = x end)
  t.advance(10)
  s.calls[2].done(nil, 'boom')
  T.eq(r4, nil)
  T.eq(c.last_error, 'boom')
  T.eq(c.stats.errors, 1)
end)

local function hex(s)
  return (s:gsub('.', function(ch) return string.format('%02x', ch:byte()) end))
end

T.test('sha1 and base64', function()
  T.eq(hex(sha1.sha1('abc')), 'a9993e364706816aba3e25717850c26c9cd0d89d')
  T.eq(hex(sha1.sha1('')), 'da39a3ee5e6b4b0d3255bfef95601890afd80709')
  T.eq(hex(sha1.sha1(string.rep('a', 1000))), '291e9a6c66994949b57ba5e650361e98fc36b1ba')
  -- RFC 6455's example handshake
  T.eq(ws.accept_key('dGhlIHNhbXBsZSBub25jZQ=='), 's3pPLMBiTxaQ9kYGzzhZRbK+xOo=')
  T.eq({ sha1.base64('f'), sha1.base64('fo'), sha1.base64('foo') }, { 'Zg==', 'Zm8=', 'Zm9v' })
end)

T.test('websocket frames: encode/decode round trip, partial input, errors', function()
  -- RFC 6455 section 5.7: a single-frame masked text message "Hello"
  local masked = ws.encode(ws.OP_TEXT, 'Hello', '\55\250\33\61')
  T.eq(hex(masked), '818537fa213d7f9f4d5158')
  for _, n in ipairs({ 0, 5, 125, 126, 65535, 65536, 70000 }) do
    local payload = string.rep('x', n)
    local f, used = ws.decode(ws.encode(ws.OP_TEXT, payload, 'abcd'))
    T.eq(f.payload, payload, 'payload of ' .. n)
    T.eq(used, #ws.encode(ws.OP_TEXT, payload, 'abcd'))
    T.eq(f.fin, true)
  end
  local frame = ws.encode(ws.OP_TEXT, string.rep('y', 300))
  T.eq(ws.decode(frame:sub(1, 3)), nil)
  T.eq(ws.decode(frame:sub(1, 200)), nil)
  local f, used = ws.decode(frame .. 'extra')
  T.eq({ #f.payload, used }, { 300, #frame })
  local _, _, err = ws.decode('\241\0') -- RSV bits
  T.ok(err and err:match('reserved'), 'reserved bits refused')
  _, _, err = ws.decode('\137\126\0\200') -- ping of 200 bytes
  T.ok(err and err:match('control'), 'long control frame refused')
  _, _, err = ws.decode(ws.encode(ws.OP_TEXT, string.rep('z', 100)), 50)
  T.ok(err and err:match('limit'), 'frame over the limit refused')
  T.eq({ ws.parse_url('ws://127.0.0.1:8088/rpc') }, { '127.0.0.1', 8088, '/rpc' })
  T.eq({ ws.parse_url('ws://localhost') }, { 'localhost', 80, '/' })
  T.eq(select(1, ws.parse_url('wss://x/rpc')), nil)
end)

T.run()
