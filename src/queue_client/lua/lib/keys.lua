-- The gaffer library's first file: the names of a queue's keys, bound at each call.
--
-- Every queue function takes its queue's keys as KEYS, in the order `Keys::new` in
-- scripts.rs gives them. All share the hash tag `{QUEUE}`, so each call touches a single
-- Redis Cluster slot. A library's top-level code runs once, when Redis loads it, so these
-- names are upvalues the library shares, set by `bind` as each call starts: Redis runs
-- one call at a time, and no call reads another's.
local KEYS
-- Redis's TIME as the call first read it (call_time in calls.lua): one read per call,
-- reset as each call starts.
local CALL_TIME
local K_READY, K_DELAYED, K_LEASED, K_DEAD
local K_PAYLOAD, K_META, K_ATT, K_ERR
local K_STATS, K_SEQ, K_TOK, K_WAKE
local K_REC, K_IDX, K_CONF, K_FROZEN
local K_EXP, K_WATCH
-- Derived from those (each described where it is used): packets (K_PKTS, the zset of live
-- ones, and K_PKTW, the count of tasks their ready entries stand for beyond one each, see
-- blocks.lua), the channel of ended tasks (records.lua), the chains' id prefix
-- (chains.lua), the lists of ended tasks and of done runs (records.lua), batch leases
-- and their count (blocks.lua), and the cancels asked of long tasks (control.lua).
local PACKET = '#p'
local K_PKTS, K_PKTW, ENDED_CHANNEL, CHAIN_PREFIX
local K_ENDS, K_DONE, K_BATCHES, K_BATCHN, K_CANCEL

-- Makes `keys` the queue's keys for the call that starts.
local function bind(keys)
  KEYS = keys
  CALL_TIME = nil
  K_READY, K_DELAYED, K_LEASED, K_DEAD = keys[1], keys[2], keys[3], keys[4]
  K_PAYLOAD, K_META, K_ATT, K_ERR = keys[5], keys[6], keys[7], keys[8]
  K_STATS, K_SEQ, K_TOK, K_WAKE = keys[9], keys[10], keys[11], keys[12]
  K_REC, K_IDX, K_CONF, K_FROZEN = keys[13], keys[14], keys[15], keys[16]
  K_EXP, K_WATCH = keys[17], keys[18]
  K_PKTS = K_REC .. PACKET .. 's'
  K_PKTW = K_PKTS .. ':w'
  ENDED_CHANNEL = string.sub(K_REC, 1, -3) .. 'ended'
  CHAIN_PREFIX = '~c' .. string.match(K_REC, '{(.-)}') .. '.'
  K_ENDS = K_EXP .. ':b'
  K_DONE = K_ENDS .. ':r'
  K_BATCHES = K_LEASED .. ':b'
  K_BATCHN = K_LEASED .. ':bn'
  K_CANCEL = K_LEASED .. ':cancel'
end

-- Whether the queue holds data of any layout: every enqueue writes K_SEQ; tasks, dead
-- letters and records outlive it only if deleted by hand.
local function holds_data()
  return redis.call('EXISTS', K_SEQ, K_PAYLOAD, K_META, K_IDX, K_DEAD) > 0
end

-- The queue's layout version (layout.rs; LAYOUT, LAYOUT_UNRECORDED and LAYOUT_FIELD come
-- from Rust, ahead of this file), checked first by every queue function (scripts.rs): a
-- gaffer reads no form it does not know. A queue holding data and no layout field is of
-- LAYOUT_UNRECORDED; one holding none is new, and a script that writes (`stamp`) records
-- the current layout. The error's first word is the code queue_client/error.rs maps.
local function layout_check(stamp)
  local v = redis.call('HGET', K_CONF, LAYOUT_FIELD)
  if v == LAYOUT then return end
  if not v then
    if not holds_data() then
      if stamp then redis.call('HSET', K_CONF, LAYOUT_FIELD, LAYOUT) end
      return
    end
    v = LAYOUT_UNRECORDED
  end
  local q = string.match(K_CONF, '{(.*)}')
  local hint = 'run gaffer migrate ' .. q
  if (tonumber(v) or 0) > tonumber(LAYOUT) then hint = 'upgrade gaffer' end
  error({err = 'LAYOUT queue ' .. q .. ' has layout ' .. v .. ', this gaffer needs layout '
    .. LAYOUT .. ': ' .. hint})
end
