-- The moments of the lists of records ended together whose time is up (expire_batched),
-- as a set. It costs one read of the due, not yet swept lists, which the sweeps of takes
-- and the manager's housekeeping keep few; a read fetches it once, and only when a record
-- needs it.
local function due_end_moments(now)
  local set, ttls = {}, nil
  for _, member in ipairs(redis.call('ZRANGEBYSCORE', K_ENDS, '-inf', now)) do
    local exp, ttl = string.match(member, '^(%d+):(%d+)$')
    local at = exp and tonumber(exp) - tonumber(ttl)
    if at and set[at] == nil then
      -- A list of the same moment made with another TTL and not due yet holds records
      -- that are not due either (ended at the same moment, a longer life): the moment is
      -- shown until it is due too, and its due list's own records go with the sweep.
      if not ttls then
        ttls = {}
        for t in string.gmatch(redis.call('HGET', K_CONF, 'ends_ttls') or '', '%d+') do
          ttls[#ttls + 1] = tonumber(t)
        end
      end
      local due = true
      for _, t in ipairs(ttls) do
        if t ~= tonumber(ttl) then
          local other = redis.call('ZSCORE', K_ENDS, string.format('%d:%d', at + t, t))
          if other and tonumber(other) > now then due = false end
        end
      end
      set[at] = due
    end
  end
  return set
end

-- What readers see of the record of `id`, writing nothing (so a read-only Redis user can
-- read): its stored value, or nil when it has none or its time is up though no sweep has
-- deleted it yet. Due as the sweep decides: by its own moment in K_EXP when it ended
-- alone (a task alive again has none there); else when it ended with a batch whose list
-- is due, and such a batch's ack wrote the end entry at the list's moment
-- (record_done_many), so its last entry ends exactly at a due moment; or, done by a batch
-- ack that wrote nothing to it, when its run is due (done_of). `due` holds what one
-- script has read of these (a table, filled on first use; pass it on to rec_current).
local function rec_visible_value(id, v, now, due)
  local exp = redis.call('ZSCORE', K_EXP, id)
  if exp then
    if tonumber(exp) <= now then return nil end
    return v
  end
  local _, st, at = last_entry(v)
  if is_end_state(st) then
    if not due.moments then due.moments = due_end_moments(now) end
    if due.moments[tonumber(at)] then return nil end
  else
    local d = done_of(id, due)
    if d and d[1] <= now then return nil end
  end
  return v
end

-- rec_visible_value of the record of `id` as stored (nil: none).
local function rec_visible(id, now, due)
  local v = rec_get(id, due)
  if not v then return nil end
  return rec_visible_value(id, v, now, due)
end

-- The record `v` of `id` unless its time is up, by the same rule readers see it by
-- (rec_visible: its own moment, its batch's list's or its run's); one whose time is up
-- is deleted now rather than at the next sweep, so a dedup never counts a record no
-- reader would show. `due` as for rec_visible.
local function rec_live(id, v, now, due)
  if rec_visible_value(id, v, now, due) then return v end
  rec_delete({id}, {v})
  redis.call('ZREM', K_EXP, id)
  return nil
end

-- A record as readers get it: {s, p, a, m, c, d, u, b, e, r, g} (state, attempt and
-- updated time from its last entry) and its history.
local REC_VIEW_FIELDS = 11
local function rec_view(v)
  local f, hist = rec_parse(v)
  local _, st, at, att = last_entry(hist)
  return {st or '', f[F.p], att or '0', f[F.m], f[F.c], f[F.d], at or f[F.c], f[F.b], f[F.e], f[F.r], f[F.g]}, hist
end

-- A live record as readers see it (rec_view), with the entries of a batch ack that wrote
-- nothing to it (done_of), or the running entry of a task a slot holds now added from its
-- running entry, or from its batch lease (`cache`: a table kept for one script, see
-- done_of and batch_run_of).
local function rec_current(id, v, cache)
  local out, hist = rec_view(v)
  if not is_end_state(out[1]) then
    local d = done_of(id, cache)
    if d then
      out[1], out[3], out[7] = 'done', '1', d[2]
      return out, hist .. d[3]
    end
  end
  local run = redis.call('GET', run_key(id))
  if not run and not is_end_state(out[1]) then run = batch_run_of(id, cache) end
  if run then
    local at, att = string.match(run, '^([^\31]*)\31([^\31]*)\31')
    out[1], out[3], out[7] = 'running', att, at
    hist = hist .. RS .. 'running' .. FS .. run
  end
  return out, hist
end
