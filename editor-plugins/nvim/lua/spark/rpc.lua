-- The client side of spark-agent's editor protocol (docs/protocol.md) for Neovim: JSON-RPC 2.0
-- over spark.ws, LSP-style lifecycle, streamed notifications routed to the request that caused
-- them (chat/delta, agent/event name it in params.id), server requests (agent/approval),
-- $/cancelRequest. Callbacks run in the main loop (safe to call the Neovim API).
local ws = require('spark.ws')

local M = {}

M.SUBPROTOCOL = 'spark-agent.jsonrpc.v1'
M.codes = {
  ParseError = -32700, InvalidRequest = -32600, MethodNotFound = -32601, InvalidParams = -32602,
  InternalError = -32603, ServerNotInitialized = -32002, RequestCancelled = -32800,
  DocumentNotOpen = -32010, ContextTooLong = -32011, Busy = -32012, Unsupported = -32013,
  NotAllowed = -32014, TooLarge = -32015,
}

local STREAMED = { ['chat/delta'] = true, ['agent/event'] = true }

local function decode(text)
  local ok, msg = pcall(vim.json.decode, text, { luanil = { object = true, array = true } })
  if not ok or type(msg) ~= 'table' then
    return nil
  end
  return msg
end

--- Params as JSON: an empty table must be an object, not an array.
local function obj(t)
  if t == nil or (type(t) == 'table' and next(t) == nil) then
    return vim.empty_dict()
  end
  return t
end
M.obj = obj

local Client = {}
Client.__index = Client

--- Open a connection and initialize. opts: url, token, init (initialize params), ping_ms
--- (30000), on_ready(client, init_result), on_error(message) (connection or initialize failed),
--- on_close(code, reason), on_log(params of window/logMessage), on_notification(method, params),
--- on_progress(token, value). Returns the client (connecting) or nil, error for a bad URL.
function M.connect(opts)
  local self = setmetatable({
    opts = opts, next_id = 1, pending = {}, handlers = {}, closed = false, ready = false,
    init_result = nil,
  }, Client)
  local headers = {}
  if opts.token and opts.token ~= '' then
    headers.Authorization = 'Bearer ' .. opts.token
  end
  local conn, err = ws.connect({
    url = opts.url,
    headers = headers,
    protocols = { M.SUBPROTOCOL },
    on_open = function()
      self:request('initialize', opts.init or {}, function(result, rerr)
        if rerr then
          if opts.on_error then
            opts.on_error('initialize: ' .. rerr.message)
          end
          self:close()
          return
        end
        self.init_result = result
        self.ready = true
        self:notify('initialized', {})
        if opts.on_ready then
          opts.on_ready(self, result)
        end
      end)
    end,
    on_message = function(text)
      self:_on_message(text)
    end,
    on_error = function(msg)
      if opts.on_error and not self.ready then
        opts.on_error(msg)
      end
    end,
    on_close = function(code, reason)
      self:_on_close(code, reason)
    end,
  })
  if not conn then
    return nil, err
  end
  self.conn = conn
  local ping_ms = opts.ping_ms or 30000
  if ping_ms > 0 then
    self.ping_timer = vim.loop.new_timer()
    self.ping_timer:start(ping_ms, ping_ms, function()
      conn:ping()
    end)
  end
  return self
end

function Client:_send(msg)
  return self.conn:send(vim.json.encode(msg))
end

--- Send a request. cb(result, err) runs once: err = { code, message, data } (code -32800 after
--- cancel). on_notify(method, params) gets the request's streamed notifications in order.
--- Returns the id and a cancel function.
function Client:request(method, params, cb, on_notify)
  local id = self.next_id
  self.next_id = id + 1
  if self.closed then
    vim.schedule(function()
      cb(nil, { code = M.codes.InternalError, message = 'not connected' })
    end)
    return id, function() end
  end
  self.pending[id] = { cb = cb, on_notify = on_notify, method = method }
  self:_send({ jsonrpc = '2.0', id = id, method = method, params = obj(params) })
  return id, function()
    if self.pending[id] and not self.closed then
      self:notify('$/cancelRequest', { id = id })
    end
  end
end

function Client:notify(method, params)
  if not self.closed then
    self:_send({ jsonrpc = '2.0', method = method, params = obj(params) })
  end
end

--- Answer server requests of `method`: handler(params, reply) calls reply(result) once (now or
--- later), or reply(nil, message) for an error.
function Client:on_request(method, handler)
  self.handlers[method] = handler
end

function Client:_on_message(text)
  local msg = decode(text)
  if not msg then
    if self.opts.on_log then
      self.opts.on_log({ type = 1, message = 'unparsable frame from the server' })
    end
    return
  end
  if msg.method ~= nil and msg.id ~= nil then
    return self:_answer(msg)
  end
  if msg.method ~= nil then
    local params = msg.params or {}
    local p = STREAMED[msg.method] and self.pending[params.id]
    if p then
      if p.on_notify then
        p.on_notify(msg.method, params)
      end
    elseif msg.method == '$/progress' then
      if self.opts.on_progress then
        self.opts.on_progress(params.token, params.value)
      end
    elseif msg.method == 'window/logMessage' then
      if self.opts.on_log then
        self.opts.on_log(params)
      end
    elseif self.opts.on_notification then
      self.opts.on_notification(msg.method, params)
    end
    return
  end
  if msg.id ~= nil then
    local p = self.pending[msg.id]
    if not p then
      return
    end
    self.pending[msg.id] = nil
    if msg.error then
      p.cb(nil, msg.error)
    else
      p.cb(msg.result, nil)
    end
  elseif msg.error and self.opts.on_log then
    self.opts.on_log({ type = 1, message = 'server: ' .. tostring(msg.error.message) })
  end
end

function Client:_answer(msg)
  local h = self.handlers[msg.method]
  if not h then
    return self:_send({ jsonrpc = '2.0', id = msg.id, error = {
      code = M.codes.MethodNotFound, message = 'client has no ' .. msg.method } })
  end
  local answered = false
  local ok, err = pcall(h, msg.params or {}, function(result, emsg)
    if answered or self.closed then
      return
    end
    answered = true
    if emsg then
      self:_send({ jsonrpc = '2.0', id = msg.id,
                   error = { code = M.codes.InternalError, message = emsg } })
    else
      self:_send({ jsonrpc = '2.0', id = msg.id, result = result == nil and vim.NIL or result })
    end
  end)
  if not ok and not answered then
    answered = true
    self:_send({ jsonrpc = '2.0', id = msg.id,
                 error = { code = M.codes.InternalError, message = tostring(err) } })
  end
end

function Client:_on_close(code, reason)
  if self.closed then
    return
  end
  self.closed = true
  if self.ping_timer and not self.ping_timer:is_closing() then
    self.ping_timer:stop()
    self.ping_timer:close()
  end
  local pending = self.pending
  self.pending = {}
  for _, p in pairs(pending) do
    p.cb(nil, { code = M.codes.InternalError,
                message = string.format('connection closed (%s %s)', code, reason or '') })
  end
  if self.opts.on_close then
    self.opts.on_close(code, reason)
  end
end

--- shutdown + exit; the server closes the connection.
function Client:shutdown()
  if self.closed then
    return
  end
  self:request('shutdown', nil, function()
    self:notify('exit', nil)
    -- the server closes with 1000; close ourselves if it does not
    vim.defer_fn(function()
      self:close()
    end, 1000)
  end)
end

function Client:close()
  if self.conn then
    self.conn:close(1000, '')
  end
end

function Client:is_open()
  return not self.closed and self.ready
end

return M
