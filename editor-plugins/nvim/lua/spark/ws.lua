-- A small WebSocket client (RFC 6455) on vim.loop TCP: Neovim 0.7 has none built in. Text
-- messages only (the protocol sends JSON in text frames), client frames masked, fragmented
-- messages reassembled, pings answered, close handshake. The frame codec is pure and tested on
-- its own; the connection part delivers callbacks through vim.schedule (never in a fast event).
local sha1 = require('spark.sha1')
local bit = require('bit')

local M = {}

local GUID = '258EAFA5-E914-47DA-95CA-C5AB0DC85B11'

M.OP_CONT, M.OP_TEXT, M.OP_BINARY = 0, 1, 2
M.OP_CLOSE, M.OP_PING, M.OP_PONG = 8, 9, 10

local function u16(n)
  return string.char(math.floor(n / 256) % 256, n % 256)
end

local function u64(n)
  local t = {}
  for i = 7, 0, -1 do
    t[#t + 1] = string.char(math.floor(n / 256 ^ i) % 256)
  end
  return table.concat(t)
end

local function apply_mask(payload, mask)
  local m = { mask:byte(1, 4) }
  local out = {}
  -- in pieces: string.char takes a limited number of arguments
  for base = 1, #payload, 4096 do
    local piece = { payload:byte(base, math.min(#payload, base + 4095)) }
    for i = 1, #piece do
      piece[i] = bit.bxor(piece[i], m[(base + i - 2) % 4 + 1])
    end
    out[#out + 1] = string.char(unpack(piece))
  end
  return table.concat(out)
end
M.apply_mask = apply_mask

--- One frame: FIN set, `opcode`, masked with `mask` (4 bytes; nil: unmasked, as a server sends).
function M.encode(opcode, payload, mask)
  local n = #payload
  local b1 = string.char(0x80 + opcode)
  local mbit = mask and 0x80 or 0
  local len
  if n < 126 then
    len = string.char(mbit + n)
  elseif n < 65536 then
    len = string.char(mbit + 126) .. u16(n)
  else
    len = string.char(mbit + 127) .. u64(n)
  end
  if mask then
    return b1 .. len .. mask .. apply_mask(payload, mask)
  end
  return b1 .. len .. payload
end

--- Parse one frame from the start of `buf`. Returns frame, bytes used; nil when more bytes are
--- needed; or nil, nil, error for a malformed frame. frame = { fin, opcode, payload }.
function M.decode(buf, max_payload)
  if #buf < 2 then
    return nil
  end
  local b1, b2 = buf:byte(1, 2)
  if bit.band(b1, 0x70) ~= 0 then
    return nil, nil, 'reserved bits set (no extension was negotiated)'
  end
  local fin = bit.band(b1, 0x80) ~= 0
  local opcode = bit.band(b1, 0x0f)
  local masked = bit.band(b2, 0x80) ~= 0
  local n = bit.band(b2, 0x7f)
  local pos = 3
  if n == 126 then
    if #buf < 4 then
      return nil
    end
    local h, l = buf:byte(3, 4)
    n = h * 256 + l
    pos = 5
  elseif n == 127 then
    if #buf < 10 then
      return nil
    end
    n = 0
    for i = 3, 10 do
      n = n * 256 + buf:byte(i)
    end
    pos = 11
  end
  if opcode >= 8 and (n > 125 or not fin) then
    return nil, nil, 'control frame too long or fragmented'
  end
  if max_payload and n > max_payload then
    return nil, nil, string.format('frame of %d bytes exceeds the limit of %d', n, max_payload)
  end
  local mask
  if masked then
    if #buf < pos + 3 then
      return nil
    end
    mask = buf:sub(pos, pos + 3)
    pos = pos + 4
  end
  if #buf < pos + n - 1 then
    return nil
  end
  local payload = buf:sub(pos, pos + n - 1)
  if mask then
    payload = apply_mask(payload, mask)
  end
  return { fin = fin, opcode = opcode, payload = payload }, pos + n - 1
end

--- Sec-WebSocket-Accept for a key.
function M.accept_key(key)
  return sha1.base64(sha1.sha1(key .. GUID))
end

local function random_bytes(n)
  local t = {}
  for i = 1, n do
    t[i] = math.random(0, 255)
  end
  return string.char(unpack(t))
end

--- Parse "ws://host:port/path". Returns host, port, path or nil, error.
function M.parse_url(url)
  local host, port, path = url:match('^ws://([^/:]+):?(%d*)(/?[^#]*)$')
  if not host then
    if url:match('^wss://') then
      return nil, 'wss:// is not supported (the server listens on loopback without TLS)'
    end
    return nil, 'not a ws:// URL: ' .. url
  end
  if path == '' then
    path = '/'
  end
  return host, tonumber(port) or 80, path
end

local Conn = {}
Conn.__index = Conn

--- Connect. opts: url, headers (table), protocols (list), max_message (bytes, default 64 MiB),
--- on_open(), on_message(text), on_close(code, reason), on_error(msg).
--- Returns the connection (it opens asynchronously) or nil, error for a bad URL.
function M.connect(opts)
  local host, port, path = M.parse_url(opts.url)
  if not host then
    return nil, port
  end
  local self = setmetatable({
    opts = opts, buf = '', state = 'connecting', parts = nil, closed = false,
    max_message = opts.max_message or 64 * 1024 * 1024,
  }, Conn)
  local tcp = vim.loop.new_tcp()
  self.tcp = tcp
  local function fail(msg)
    self:_finish(1006, msg, true)
  end
  vim.loop.getaddrinfo(host, tostring(port), { socktype = 'stream' }, function(err, addrs)
    if err or not addrs or #addrs == 0 then
      return fail('cannot resolve ' .. host .. ': ' .. tostring(err))
    end
    tcp:connect(addrs[1].addr, port, function(cerr)
      if cerr then
        return fail(string.format('cannot connect to %s:%d: %s', host, port, cerr))
      end
      local key = sha1.base64(random_bytes(16))
      self.key = key
      local req = {
        'GET ' .. path .. ' HTTP/1.1',
        'Host: ' .. host .. ':' .. port,
        'Upgrade: websocket',
        'Connection: Upgrade',
        'Sec-WebSocket-Key: ' .. key,
        'Sec-WebSocket-Version: 13',
      }
      if opts.protocols and #opts.protocols > 0 then
        req[#req + 1] = 'Sec-WebSocket-Protocol: ' .. table.concat(opts.protocols, ', ')
      end
      for k, v in pairs(opts.headers or {}) do
        req[#req + 1] = k .. ': ' .. v
      end
      tcp:write(table.concat(req, '\r\n') .. '\r\n\r\n')
      tcp:read_start(function(rerr, data)
        if rerr then
          return fail('read: ' .. rerr)
        end
        if not data then
          return self:_finish(self.close_code or 1006, self.close_reason or 'connection lost')
        end
        self:_feed(data)
      end)
    end)
  end)
  return self
end

function Conn:_emit(name, ...)
  local cb = self.opts[name]
  if cb then
    local args = { n = select('#', ...), ... }
    vim.schedule(function()
      cb(unpack(args, 1, args.n))
    end)
  end
end

function Conn:_feed(data)
  self.buf = self.buf .. data
  if self.state == 'connecting' then
    local e = self.buf:find('\r\n\r\n', 1, true)
    if not e then
      if #self.buf > 16384 then
        self:_finish(1002, 'handshake response too long', true)
      end
      return
    end
    local head = self.buf:sub(1, e - 1)
    self.buf = self.buf:sub(e + 4)
    local status = tonumber(head:match('^HTTP/1%.1 (%d%d%d)'))
    if status ~= 101 then
      local line = head:match('^[^\r\n]*') or ''
      return self:_finish(1002, 'handshake refused: ' .. line, true)
    end
    local accept
    for k, v in head:gmatch('\r\n([^:\r\n]+):%s*([^\r\n]*)') do
      if k:lower() == 'sec-websocket-accept' then
        accept = v
      end
    end
    if accept ~= M.accept_key(self.key) then
      return self:_finish(1002, 'handshake: wrong Sec-WebSocket-Accept', true)
    end
    self.state = 'open'
    self:_emit('on_open')
  end
  while self.state == 'open' or self.state == 'closing' do
    local f, used, err = M.decode(self.buf, self.max_message)
    if err then
      self:_send_frame(M.OP_CLOSE, u16(1002) .. err)
      return self:_finish(1002, err, true)
    end
    if not f then
      return
    end
    self.buf = self.buf:sub(used + 1)
    self:_frame(f)
  end
end

function Conn:_frame(f)
  if f.opcode == M.OP_PING then
    self:_send_frame(M.OP_PONG, f.payload)
  elseif f.opcode == M.OP_PONG then
    return
  elseif f.opcode == M.OP_CLOSE then
    local code = 1005
    if #f.payload >= 2 then
      code = f.payload:byte(1) * 256 + f.payload:byte(2)
    end
    self.close_code, self.close_reason = code, f.payload:sub(3)
    if self.state == 'open' then
      self:_send_frame(M.OP_CLOSE, f.payload:sub(1, 2))
    end
    self:_finish(code, f.payload:sub(3))
  elseif f.opcode == M.OP_TEXT or f.opcode == M.OP_BINARY then
    if f.fin then
      if f.opcode == M.OP_TEXT then
        self:_emit('on_message', f.payload)
      end
    else
      self.parts = { op = f.opcode, f.payload }
      self.parts_len = #f.payload
    end
  elseif f.opcode == M.OP_CONT and self.parts then
    self.parts[#self.parts + 1] = f.payload
    self.parts_len = self.parts_len + #f.payload
    if self.parts_len > self.max_message then
      self:_send_frame(M.OP_CLOSE, u16(1009))
      return self:_finish(1009, 'message too big', true)
    end
    if f.fin then
      local op = self.parts.op
      local text = table.concat(self.parts)
      self.parts = nil
      if op == M.OP_TEXT then
        self:_emit('on_message', text)
      end
    end
  end
end

function Conn:_send_frame(opcode, payload)
  if self.closed or self.tcp:is_closing() then
    return false
  end
  self.tcp:write(M.encode(opcode, payload, random_bytes(4)))
  return true
end

--- Send a text message. Returns false when the connection is not open.
function Conn:send(text)
  if self.state ~= 'open' then
    return false
  end
  return self:_send_frame(M.OP_TEXT, text)
end

function Conn:ping()
  if self.state == 'open' then
    self:_send_frame(M.OP_PING, '')
  end
end

--- Start the close handshake (the server answers and closes the TCP connection).
function Conn:close(code, reason)
  if self.state ~= 'open' then
    return self:_finish(code or 1000, reason or '')
  end
  self.state = 'closing'
  self:_send_frame(M.OP_CLOSE, u16(code or 1000) .. (reason or ''))
  -- do not wait forever for the server's close frame
  local t = vim.loop.new_timer()
  t:start(2000, 0, function()
    t:close()
    self:_finish(code or 1000, reason or '')
  end)
end

function Conn:_finish(code, reason, is_error)
  if self.closed then
    return
  end
  self.closed = true
  self.state = 'closed'
  if not self.tcp:is_closing() then
    self.tcp:read_stop()
    self.tcp:close()
  end
  if is_error then
    self:_emit('on_error', reason)
  end
  self:_emit('on_close', code, reason)
end

function Conn:is_open()
  return self.state == 'open'
end

return M
