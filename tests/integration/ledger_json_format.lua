-- FROZEN: ledger.lua as it was when records were JSON objects (before the struct-packed
-- format). tests/integration/test_ledger_old_format.py writes old-format records with it;
-- never edit it.
--
-- effectq ledger: every state transition of an effect record, one atomic call each.
--
-- Read this against DESIGN.md §2. One script, dispatched on ARGV[1], so that the whole
-- state table sits in one file; every call is one EVALSHA round trip.
--
-- KEYS (all share one hash tag, the record's bucket: one slot, Cluster-safe)
--   KEYS[1]  record   string: JSON object, fields below
--   KEYS[2]  leases   zset:   effect key -> lease deadline (ms, server clock) of every
--                              CLAIMED / RECONCILING record in the bucket; the reconciler
--                              scans only this, never the keyspace
--   KEYS[3]  stats    hash:   "<STATE>:<tool>" -> number of records in CLAIMED, RECONCILING,
--                              UNKNOWN (the states that never expire); counters
--                              "fenced:<op>" (stale writes refused), "dup_submit:<tool>",
--                              "dup_claim:<tool>" (duplicates suppressed at each stage),
--                              "conflict:<tool>"
--   KEYS[4]  pending  string: "<fingerprint>|<message id>" of a live broker message for this
--                              effect (producer-side dedupe before the broker); expires by
--                              itself, cleared on DONE and on dead-letter
--   KEYS[5]  unknown  zset:   effect key -> ms it became UNKNOWN: the operators' work queue
--   KEYS[6]  campaigns hash:  "<campaign tag>:<STATE>" -> records of one campaign in each
--                              state (campaign status without a scan; kept apart from
--                              the stats so a metrics scrape does not grow with campaigns)
--   KEYS[7]  floor    string: the highest token of any record of the bucket saved with a TTL
--                              (settled): a fresh record starts above it, so a key's tokens
--                              keep growing after its record expired (a stale holder's token
--                              never becomes valid again). Never expires.
-- ARGV[1] op, ARGV[2] effect key (the lease-index member), then per op (see each function).
--
-- Record fields (short names keep a DONE record small):
--   s state   t fencing token (per key, only grows, also across the record's expiry)
--   f fingerprint   g generation (bumped only by a claim for a submission made after a
--   revoke/supersede: see claim)
--   tool      n attempts (claims granted)             c created ms
--   d lease deadline ms (CLAIMED/RECONCILING only)    h holder (CLAIMED/RECONCILING only)
--   a ms of the last granted claim (when the effect may first have been sent)
--   x ms the reconciler first took it over, ra reconciler takeovers (RECONCILING only)
--   cp campaign tag (a hash of the campaign id) when the effect belongs to a campaign
--   q request (opaque JSON text)   r receipt (opaque JSON text)   raw provider's raw
--   response when it differs from r   lr late receipts [[token, receipt, ms], ...]
--   y history [[state, token, ms, note], ...] (the last HISTORY entries)
--
-- Time is the server's (TIME), never a client clock. A claim never expires by itself: an
-- expired lease makes the record `blocked` until the reconciler takes it over.

local HISTORY = 16
local LATE = 8

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local op = ARGV[1]
local key = ARGV[2]
local rec = nil
local blob = redis.call('GET', KEYS[1])
if blob then rec = cjson.decode(blob) end

local COUNTED = {CLAIMED = true, RECONCILING = true, UNKNOWN = true}

local function count(state, delta)
  if state and COUNTED[state] then
    redis.call('HINCRBY', KEYS[3], state .. ':' .. rec.tool, delta)
  end
end

-- Move rec to `state`, keeping counts, lease index and history in step with it.
local function move(state, token, note, deadline)
  if rec.s == 'UNKNOWN' and state ~= 'UNKNOWN' then redis.call('ZREM', KEYS[5], key) end
  if state == 'UNKNOWN' then redis.call('ZADD', KEYS[5], now, key) end
  count(rec.s, -1)
  if rec.cp then
    if rec.s then redis.call('HINCRBY', KEYS[6], rec.cp .. ':' .. rec.s, -1) end
    redis.call('HINCRBY', KEYS[6], rec.cp .. ':' .. state, 1)
  end
  rec.s = state
  rec.t = token
  count(state, 1)
  local y = rec.y or {}
  y[#y + 1] = {state, token, now, note or ''}
  while #y > HISTORY do table.remove(y, 1) end
  rec.y = y
  if state ~= 'RECONCILING' then
    rec.x, rec.ra = nil, nil
  end
  if deadline then
    rec.d = deadline
    redis.call('ZADD', KEYS[2], deadline, key)
  else
    -- Settled: lease, holder and claim time matter no more (a DONE record stays small).
    rec.d, rec.h, rec.a = nil, nil, nil
    redis.call('ZREM', KEYS[2], key)
  end
end

local function floor()
  return tonumber(redis.call('GET', KEYS[7]) or '0')
end

local function save(retention_ms)
  if retention_ms and retention_ms > 0 then
    -- The record may expire: remember its token, so the key's next record starts above it.
    if floor() < rec.t then redis.call('SET', KEYS[7], rec.t) end
    redis.call('SET', KEYS[1], cjson.encode(rec), 'PX', retention_ms)
  else
    redis.call('SET', KEYS[1], cjson.encode(rec))
  end
end

local function fenced(name)
  redis.call('HINCRBY', KEYS[3], 'fenced:' .. name, 1)
  if rec then return {'fenced', rec.s, rec.t} end
  return {'fenced', 'ABSENT', 0}
end

local function bump(name, tool)
  redis.call('HINCRBY', KEYS[3], name .. ':' .. tool, 1)
end

local function refused()
  if rec then return {'refused', rec.s, rec.t} end
  return {'refused', 'ABSENT', 0}
end

-- claim(fingerprint, tool, lease_ms, holder, request, campaign tag or '', generation)
-- `generation` is the one the message was submitted for (submit's answer, carried by the
-- envelope): only a submission or replay made after a revoke may open the next generation.
--   none                                   -> CLAIMED, token floor+1  => acquired
--   FAILED                                 -> CLAIMED, token+1        => acquired
--   REVOKED | SUPERSEDED, generation > g   -> CLAIMED g+1, token+1    => acquired
--   REVOKED | SUPERSEDED, generation <= g: a message of the voided generation
--                                                                     => duplicate(receipt)
--   otherwise: fingerprint differs                                    => conflict
--   DONE                                                              => duplicate(receipt)
--   CLAIMED with a live lease, RECONCILING                            => in_flight
--   CLAIMED with an expired lease, UNKNOWN                            => blocked
-- in_flight / blocked end with the ms to the lease deadline (negative once it has passed;
-- nil without one: UNKNOWN), so a worker backs off towards it.
local function claim()
  local fp, tool, lease_ms, holder, request = ARGV[3], ARGV[4], tonumber(ARGV[5]), ARGV[6], ARGV[7]
  local campaign = ARGV[8] ~= '' and ARGV[8] or nil
  local generation = tonumber(ARGV[9]) or 0
  local deadline = now + lease_ms
  if not rec then
    local token = floor() + 1
    rec = {s = false, t = 0, f = fp, g = 0, tool = tool, n = 0, c = now, cp = campaign}
    move('CLAIMED', token, 'claim', deadline)
    rec.n, rec.h, rec.q, rec.a = 1, holder, request, now
    redis.call('SET', KEYS[1], cjson.encode(rec), 'NX')
    return {'acquired', token, 0}
  end
  local s = rec.s
  if (s == 'REVOKED' or s == 'SUPERSEDED') and generation <= rec.g then
    bump('dup_claim', tool)
    return {'duplicate', rec.t, rec.g, rec.r or '', s}
  end
  if s == 'FAILED' or s == 'REVOKED' or s == 'SUPERSEDED' then
    if s ~= 'FAILED' then rec.g = rec.g + 1 end
    rec.f, rec.tool, rec.r, rec.raw = fp, tool, nil, nil
    move('CLAIMED', rec.t + 1, 'claim', deadline)
    rec.n, rec.h, rec.q, rec.a = rec.n + 1, holder, request, now
    save(0)
    return {'acquired', rec.t, rec.g}
  end
  if rec.f ~= fp then
    bump('conflict', tool)
    return {'conflict', s, rec.t}
  end
  if s == 'DONE' then
    bump('dup_claim', tool)
    return {'duplicate', rec.t, rec.g, rec.r, s}
  end
  local remaining = rec.d and rec.d - now or false
  if s == 'RECONCILING' or (s == 'CLAIMED' and rec.d > now) then
    return {'in_flight', s, rec.t, remaining}
  end
  return {'blocked', s, rec.t, remaining}
end

-- heartbeat(token, lease_ms): the holder of CLAIMED or RECONCILING under `token` extends
-- its lease (the reconciler uses it to "look again later"). Stale token => fenced.
local function heartbeat()
  local token, lease_ms = tonumber(ARGV[3]), tonumber(ARGV[4])
  if not rec or rec.t ~= token or (rec.s ~= 'CLAIMED' and rec.s ~= 'RECONCILING') then
    return fenced('heartbeat')
  end
  rec.d = now + lease_ms
  redis.call('ZADD', KEYS[2], rec.d, key)
  save(0)
  return {'ok', rec.s, rec.t}
end

-- commit(token, receipt, raw, retention_ms, note): CLAIMED | RECONCILING under `token`
-- -> DONE. A retry of the same commit is ok. Stale token => fenced, and the receipt is kept
-- in late receipts as evidence (never as authority). On FAILED that evidence contradicts
-- the record ("known not executed"): FAILED -> UNKNOWN under token+1, which blocks every
-- claim and replay until an operator resolves it.
local function commit()
  local token, receipt, raw, retention_ms = tonumber(ARGV[3]), ARGV[4], ARGV[5], tonumber(ARGV[6])
  if rec and rec.t == token and rec.s == 'DONE' then return {'ok', 'DONE', token} end
  if not rec or rec.t ~= token or (rec.s ~= 'CLAIMED' and rec.s ~= 'RECONCILING') then
    if rec then
      local lr = rec.lr or {}
      lr[#lr + 1] = {token, receipt, now}
      while #lr > LATE do table.remove(lr, 1) end
      rec.lr = lr
      if rec.s == 'FAILED' then
        move('UNKNOWN', rec.t + 1, 'late receipt after FAILED', nil)
        save(0)
      else
        local ttl = redis.call('PTTL', KEYS[1])
        save(ttl > 0 and ttl or 0)
      end
    end
    return fenced('commit')
  end
  rec.r = receipt
  if raw ~= '' then rec.raw = raw end
  move('DONE', token, ARGV[7], nil)
  save(retention_ms)
  redis.call('DEL', KEYS[4])
  return {'ok', 'DONE', token}
end

-- fail(token, reason, retention_ms): CLAIMED | RECONCILING under `token` -> FAILED: known
-- not executed. The key is free again: the next claim is granted.
local function fail()
  local token, reason, retention_ms = tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5])
  if rec and rec.t == token and rec.s == 'FAILED' then return {'ok', 'FAILED', token} end
  if not rec or rec.t ~= token or (rec.s ~= 'CLAIMED' and rec.s ~= 'RECONCILING') then
    return fenced('fail')
  end
  move('FAILED', token, reason, nil)
  save(retention_ms)
  return {'ok', 'FAILED', token}
end

-- handover(token, reason): the holder of CLAIMED does not know whether the effect happened;
-- its lease ends now so the reconciler takes the record at its next scan.
local function handover()
  local token, reason = tonumber(ARGV[3]), ARGV[4]
  if not rec or rec.t ~= token or rec.s ~= 'CLAIMED' then return fenced('handover') end
  move('CLAIMED', token, 'handover: ' .. reason, now)
  save(0)
  return {'ok', 'CLAIMED', token}
end

-- takeover(lease_ms, holder): CLAIMED or RECONCILING whose lease has expired -> RECONCILING
-- under token+1. Returns what the reconciler needs to ask the provider and to judge the
-- answer: when the claim was granted, when reconciliation began, how many takeovers so far.
local function takeover()
  local lease_ms, holder = tonumber(ARGV[3]), ARGV[4]
  if not rec or (rec.s ~= 'CLAIMED' and rec.s ~= 'RECONCILING') or rec.d > now then
    -- A stale index entry (record gone or settled) is dropped here, not by a scan.
    if not rec or (rec.s ~= 'CLAIMED' and rec.s ~= 'RECONCILING') then
      redis.call('ZREM', KEYS[2], key)
    end
    return refused()
  end
  local from = rec.s
  local since, rounds = rec.x or now, (rec.ra or 0) + 1
  move('RECONCILING', rec.t + 1, 'takeover from ' .. from, now + lease_ms)
  rec.h, rec.x, rec.ra = holder, since, rounds
  save(0)
  return {
    'acquired', rec.t, rec.g, rec.tool, rec.q or '', rec.n, rec.a or rec.c,
    cjson.encode(rec.lr or {}), since, rounds, now,
  }
end

-- unknown(token, reason): RECONCILING under `token` -> UNKNOWN: the outcome cannot be
-- established; every claim is blocked until an operator resolves it with evidence.
local function unknown()
  local token, reason = tonumber(ARGV[3]), ARGV[4]
  if not rec or rec.t ~= token or rec.s ~= 'RECONCILING' then return fenced('unknown') end
  move('UNKNOWN', token, reason, nil)
  save(0)
  return {'ok', 'UNKNOWN', token}
end

-- operate(action, note, retention_ms, receipt, raw, override): operator transitions,
-- token+1 so that any older holder is fenced.
--   resolve_done    UNKNOWN -> DONE (evidence: receipt)
--   resolve_failed  UNKNOWN -> FAILED; refused while the record holds late receipts
--                   (evidence of execution) unless override = '1'. Checked here, in the
--                   same call as the write, so a receipt cannot land in between.
--   revoke          DONE    -> REVOKED      (a submission after it opens generation n+1)
--   supersede       DONE    -> SUPERSEDED   (a submission after it opens generation n+1)
local OPERATOR = {
  resolve_done = {from = 'UNKNOWN', to = 'DONE'},
  resolve_failed = {from = 'UNKNOWN', to = 'FAILED'},
  revoke = {from = 'DONE', to = 'REVOKED'},
  supersede = {from = 'DONE', to = 'SUPERSEDED'},
}
local function operate()
  local action, note, retention_ms = ARGV[3], ARGV[4], tonumber(ARGV[5])
  local rule = OPERATOR[action]
  if not rule then return redis.error_reply('unknown operator action ' .. action) end
  if not rec or rec.s ~= rule.from then return refused() end
  if action == 'resolve_failed' and rec.lr and #rec.lr > 0 and ARGV[8] ~= '1' then
    return {'refused', rec.s, rec.t, #rec.lr}
  end
  if rule.to == 'DONE' then
    rec.r = ARGV[6]
    if ARGV[7] ~= '' then rec.raw = ARGV[7] end
  end
  move(rule.to, rec.t + 1, note, nil)
  save(retention_ms)
  return {'ok', rule.to, rec.t}
end

-- submit(fingerprint, tool, pending_ms, message_id, force): may the producer enqueue?
-- force = '1' (a campaign re-submission) enqueues despite a pending marker: that message
-- may have been lost, and a second message for one effect is harmless (the claim decides).
-- Reads the record, writes only the pending marker and counters: not a state transition.
-- Every answer is {status, state, token, receipt or '', generation}: the generation a
-- message enqueued now is submitted for (the claim compares it): the record's, or g+1 on
-- REVOKED / SUPERSEDED (a submission after a revoke opens the next generation), 0 if none.
--   DONE, same fingerprint                        => done(receipt)
--   fingerprint differs (and the key is held)     => conflict
--   CLAIMED with a live lease, RECONCILING        => pending (a worker has it)
--   CLAIMED with an expired lease, UNKNOWN        => blocked (awaiting reconciliation/operator)
--   none | FAILED | REVOKED | SUPERSEDED: a live pending marker with another fingerprint
--                                   => conflict, with this one => pending (enqueue when
--                                   it is this message id's own), none => enqueue
local function submit()
  local fp, tool, pending_ms, message_id = ARGV[3], ARGV[4], tonumber(ARGV[5]), ARGV[6]
  local force = ARGV[7] == '1'
  local s = rec and rec.s
  local generation = 0
  if rec then generation = (s == 'REVOKED' or s == 'SUPERSEDED') and rec.g + 1 or rec.g end
  local function answer(status, receipt)
    return {status, s or 'ABSENT', rec and rec.t or 0, receipt or '', generation}
  end
  local free = not rec or s == 'FAILED' or s == 'REVOKED' or s == 'SUPERSEDED'
  if not free then
    if rec.f ~= fp then
      bump('conflict', tool)
      return answer('conflict')
    end
    bump('dup_submit', tool)
    if s == 'DONE' then return answer('done', rec.r) end
    if s == 'RECONCILING' or (s == 'CLAIMED' and rec.d > now) then
      return answer('pending')
    end
    return answer('blocked')
  end
  local marker = redis.call('GET', KEYS[4])
  -- A repeat of this very submission (a retried call whose reply was lost) answers as the
  -- first did: submit is safe to repeat per message id.
  if not marker or marker == fp .. '|' .. message_id
      or (force and string.sub(marker, 1, #fp) == fp) then
    redis.call('SET', KEYS[4], fp .. '|' .. message_id, 'PX', pending_ms)
    return answer('enqueue')
  end
  if string.sub(marker, 1, #fp) ~= fp then
    bump('conflict', tool)
    return answer('conflict')
  end
  bump('dup_submit', tool)
  return answer('pending')
end

local OPS = {
  submit = submit, claim = claim, heartbeat = heartbeat, commit = commit, fail = fail,
  handover = handover, takeover = takeover, unknown = unknown, operate = operate,
}
local fn = OPS[op]
if not fn then return redis.error_reply('unknown ledger op ' .. tostring(op)) end
return fn()
