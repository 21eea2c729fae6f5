-- Lua's unpack is limited to a few thousand values: variadic calls go in chunks (even size,
-- so score/member and field/value pairs never split).
local CHUNK = 4000

-- Redis's own clock, so that clients with skewed clocks agree on leases and due times.
-- Read once per call: a call's parts (a settle and the take after it) see one time, and
-- a TIME through Lua cost about as much as the rest of a short step.
local function call_time()
  if not CALL_TIME then CALL_TIME = redis.call('TIME') end
  return CALL_TIME
end

local function now_ms()
  local t = call_time()
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The same clock in µs (under 2^53 for millennia, so a Lua number holds it exactly).
local function now_us()
  local t = call_time()
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function bulk(cmd, key, items)
  local n = #items
  local i = 1
  while i <= n do
    local j = math.min(i + CHUNK - 1, n)
    if key then
      redis.call(cmd, key, unpack(items, i, j))
    else
      redis.call(cmd, unpack(items, i, j))
    end
    i = j + 1
  end
end

-- The values of string keys, nil (false) where there is none, in chunks.
local function mget(keys)
  if #keys == 0 then return {} end
  if #keys <= CHUNK then return redis.call('MGET', unpack(keys)) end
  local vals = {}
  local i = 1
  while i <= #keys do
    local j = math.min(i + CHUNK - 1, #keys)
    local part = redis.call('MGET', unpack(keys, i, j))
    for x = 1, #part do vals[i + x - 1] = part[x] end
    i = j + 1
  end
  return vals
end

local function hmget(key, ids)
  if #ids == 0 then return {} end
  if #ids <= CHUNK then return redis.call('HMGET', key, unpack(ids)) end
  local out = {}
  local n = #ids
  local i = 1
  while i <= n do
    local j = math.min(i + CHUNK - 1, n)
    local part = redis.call('HMGET', key, unpack(ids, i, j))
    for k = 1, #part do out[#out + 1] = part[k] end
    i = j + 1
  end
  return out
end

-- The head of a function's arguments, by name (args.rs): a table from each of `names` to
-- the argument at its place in `argv`.
local function head(argv, names)
  local h = {}
  for i = 1, #names do h[names[i]] = argv[i] end
  return h
end
