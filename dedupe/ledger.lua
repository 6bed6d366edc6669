-- effectq ledger: every state transition of an effect record, one atomic call each.
--
-- Read this against DESIGN.md §2. One script, dispatched on ARGV[1], so that the whole
-- state table sits in one file; every call is one round trip (FCALL, or EVALSHA: script.py).
--
-- KEYS (all share one hash tag, the record's bucket: one slot, Cluster-safe)
--   KEYS[1]  record   string: struct-packed fields (below), under the name this ledger
--                              writes (dedupe/keys.py: short base64url, or hex)
--   KEYS[2]  leases   zset:   effect key -> lease deadline (ms, server clock) of every
--                              CLAIMED / RECONCILING record in the bucket; the reconciler
--                              scans only this, never the keyspace
--   KEYS[3]  stats    hash:   "<STATE>:<tool>" -> number of records in CLAIMED, RECONCILING,
--                              UNKNOWN (the states that never expire); counters
--                              "fenced:<op>" (stale writes refused), "dup_submit:<tool>",
--                              "dup_claim:<tool>" (duplicates suppressed at each stage),
--                              "conflict:<tool>"
--   KEYS[4]  pending  string: "<fingerprint hex>|<message id>" of a live broker message for this
--                              effect (producer-side dedupe before the broker), confirmed
--                              by the producer once the broker accepted it (confirm);
--                              "...|<message id>|r" until then (a reservation, written by
--                              submit); expires by itself, cleared on DONE and on dead-letter
--   KEYS[5]  unknown  zset:   effect key -> ms it became UNKNOWN: the operators' work queue
--   KEYS[6]  campaigns hash:  "<campaign tag>:<STATE>" -> records of one campaign in each
--                              state (campaign status without a scan; kept apart from
--                              the stats so a metrics scrape does not grow with campaigns)
--   KEYS[7]  floor    string: at least the highest token of any record of the bucket saved
--                              with a TTL (settled), and the last token given to a fresh record:
--                              a fresh record's token is its INCR, so a key's tokens keep growing
--                              after its record expired (a stale holder's token never becomes
--                              valid again). Never expires.
--   KEYS[8]  record   the same record under its other name: read with KEYS[1] (one MGET),
--                              taken when KEYS[1] holds none, and deleted when the record is
--                              written under KEYS[1] (so one name holds it at a time,
--                              whichever spelling wrote it last)
-- ARGV[1] op, ARGV[2] effect key (the lease-index member), then per op (see each function).
--
-- Record fields, as the script holds them in a Lua table (short names, DESIGN §2):
--   s state   t fencing token (per key, only grows, also across the record's expiry)
--   f fingerprint (32 bytes, binary)   g generation (bumped only by a claim for a
--   submission made after a revoke/supersede: see claim)
--   tool      n attempts (claims granted)             c created ms
--   d lease deadline ms (CLAIMED/RECONCILING only)    h holder (CLAIMED/RECONCILING only)
--   a ms of the last granted claim (when the effect may first have been sent)
--   x ms the reconciler first took it over, ra reconciler takeovers (RECONCILING only)
--   cp campaign tag (a hash of the campaign id) when the effect belongs to a campaign
--   q request (opaque JSON text): replay sends it again from FAILED. Dropped when the record
--   settles DONE (commit, resolve_done): a DONE record, and the REVOKED / SUPERSEDED one it
--   becomes, keeps the fingerprint only, so replay from those takes the call from the
--   operator and checks it against the key and fingerprint (issue 39: 456 -> 360 B per
--   DONE record, and no raw arguments kept for the retention)
--   r receipt (opaque JSON text)   raw provider's raw response when it differs from r
--   lb the late receipts, ln of them (the last LATE): [token, receipt, ms] each
--   yb the history, yn steps: [state, token, ms, note] each (the last HISTORY; the last
--   DONE_HISTORY on DONE, the bulk of records; an operator's revoke keeps what is left)
--
-- Stored form: one string, struct-packed (big-endian), read and written by one C call each
-- plus the two lists lb and yb, which stay packed (a transition appends to them; only
-- takeover and get unpack them). A binary fingerprint and fixed-width integers take half the
-- bytes of JSON with hex:
--   layout (SETTLED, or LIVE when the record has a lease deadline) * 16 + state code, t, g,
--   n, c, f; LIVE only: d, a, x, ra, h; then tool, cp, q, r, raw (empty = absent; tool and cp
--   are short names, under 256 bytes), ln and the bytes of lb, lb, yn, yb. A record written
--   before this format is a JSON object (first byte '{'): it is read as such and saved in
--   this form at its next write. A ledger that writes short record names writes a settled
--   record in the TIGHT layout instead (absent fields take no bytes; see TIGHT_HEAD) and
--   leaves the usual notes out of its history steps (DEFAULT_NOTE); every layout is read
--   whichever ledger reads it.
--
-- Time is the server's (TIME), never a client clock. A claim never expires by itself: an
-- expired lease makes the record `blocked` until the reconciler takes it over.

local HISTORY = 16
local DONE_HISTORY = 4
local LATE = 8
-- The suffix of a pending marker that is only a reservation (see submit).
local RESERVED = '|r'

local SETTLED, LIVE, TIGHT = 1, 2, 3
local CODE = {CLAIMED = 1, DONE = 2, FAILED = 3, RECONCILING = 4, UNKNOWN = 5,
  REVOKED = 6, SUPERSEDED = 7}
local NAME = {'CLAIMED', 'DONE', 'FAILED', 'RECONCILING', 'UNKNOWN', 'REVOKED', 'SUPERSEDED'}
-- layout * 16 + state code, t, g, n, c, f; LIVE: d, a, x, ra, h (0 / empty = absent); then
-- tool, cp, q, r, raw, the number of late receipts and their bytes (reads start after the
-- first byte, which they have looked at already)
local SETTLED_FORMAT = '>BI6I4I2I6Bc0Bc0Bc0I3c0I3c0I3c0BI3'
local LIVE_FORMAT = '>BI6I4I2I6Bc0I6I6I6I2Hc0Bc0Bc0I3c0I3c0I3c0BI3'
local SETTLED_READ = '>I6I4I2I6Bc0Bc0Bc0I3c0I3c0I3c0BI3'
local LIVE_READ = '>I6I4I2I6Bc0I6I6I6I2Hc0Bc0Bc0I3c0I3c0I3c0BI3'
-- TIGHT (a settled record written under a short name: dedupe/keys.py): t, g, n, c, the 32
-- fingerprint bytes, a byte of flags for the optional fields (cp, q, r, raw, late
-- receipts: absent ones take no bytes, not a zero length each), tool; then each present
-- field in that order, ln and lb together; then yn, yb. 11 bytes under SETTLED's: with the
-- default notes left out (DEFAULT_NOTE), a DONE record with a 100-byte receipt is 182
-- bytes, inside jemalloc's 192-byte class (SETTLED's 204 take 224).
local TIGHT_HEAD = '>I6I4I2I6c32BBc0'
local TIGHT_FIELDS = {{'cp', 1, '>Bc0'}, {'q', 2, '>I3c0'}, {'r', 4, '>I3c0'},
  {'raw', 8, '>I3c0'}}
local TIGHT_LATE = 16
local LATE_ENTRY = '>I6I3c0I6'          -- token, receipt, ms (15 bytes and the receipt)
local LATE_BYTES = 16777215              -- the late list's length field: three bytes
-- state code, token - the previous step's token, ms, note: a step is the only change of a
-- record's token, always by 0 or 1 but at a fresh record, whose first step nothing precedes;
-- so the tokens are t and the distances back from it, and a step takes no token field
local STEP = '>BBI6Hc0'
-- The note a step takes when its writer gave the usual one; a ledger writing short names
-- (`compact`) stores it as '' and every reader gives it back (history).
local DEFAULT_NOTE = {[1] = 'claim', [2] = 'commit'}

-- One call's state, set by run() before anything reads it: the keys and arguments, the
-- server's time, the effect key, its decoded record (nil: none) and the name it was read
-- under (KEYS[1], or KEYS[8]: see save). Module-level so that
-- the helpers below are made once per load, not per call (a Redis Function library is
-- loaded once; under EVAL the whole file runs per call, as before).
local K, A, now, key, rec, stored, compact
local OPS = {}
-- The ops that read the clock themselves, only on the paths that need it (clock()).
local LAZY_CLOCK = {claim = true, get = true}
local MARKER_OPS = {}

-- The server's time (ms) in `now`, read once per call when first needed: a claim that finds
-- a DONE record (a duplicate, the bulk of claims once effects settle), a conflict or a voided
-- generation, and a read, answer without it (one command fewer).
local function clock()
  if not now then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
end

local function nonzero(v) if v ~= 0 then return v end end
local function nonempty(v) if v ~= '' then return v end end

local function hex(bytes)
  return string.format(string.rep('%02x', #bytes), string.byte(bytes, 1, -1))
end

-- Drop the oldest entries of a packed list until `keep` are left.
local function trim(blob, n, keep, fmt)
  local pos = 1
  while n > keep do
    pos = select(-1, struct.unpack(fmt, blob, pos))
    n = n - 1
  end
  return string.sub(blob, pos), n
end

-- The late receipts as [token, receipt, ms] arrays (the reads that return them).
local function late_list(rec)
  local list, pos = {}, 1
  for j = 1, rec.ln do
    local token, receipt, ms
    token, receipt, ms, pos = struct.unpack(LATE_ENTRY, rec.lb, pos)
    list[j] = {token, receipt, ms}
  end
  return list
end

-- The history as [state, token, ms, note] arrays, tokens counted back from t.
local function history(rec)
  local list, back, pos = {}, {}, 1
  for j = 1, rec.yn do
    local code, delta, ms, note
    code, delta, ms, note, pos = struct.unpack(STEP, rec.yb, pos)
    if note == '' then note = DEFAULT_NOTE[code] or '' end
    list[j], back[j] = {NAME[code], 0, ms, note}, delta
  end
  local token = rec.t
  for j = rec.yn, 1, -1 do
    list[j][2] = token
    token = token - back[j]
  end
  return list
end

-- The late receipts (lb: packed, ln of them) and the history (yb, yn) stay packed in the
-- record table: a transition appends to them and nothing else reads them on the hot path.
local function decode(blob)
  local head = string.byte(blob, 1)
  if head == 123 then  -- '{': a record of the JSON format this one replaced
    local rec = cjson.decode(blob)
    rec.f = string.gsub(rec.f, '%x%x', function(h) return string.char(tonumber(h, 16)) end)
    rec.n, rec.c = rec.n or 0, rec.c or 0
    local lr, y = rec.lr or {}, rec.y or {}
    local parts = {}
    for j, e in ipairs(lr) do parts[j] = struct.pack(LATE_ENTRY, e[1], #e[2], e[2], e[3]) end
    rec.lb, rec.ln = table.concat(parts), #lr
    parts = {}
    local last = y[1] and y[1][2] or 0
    for j, e in ipairs(y) do
      parts[j] = struct.pack(STEP, CODE[e[1]], math.min(e[2] - last, 255), e[3], #e[4], e[4])
      last = e[2]
    end
    rec.yb, rec.yn = table.concat(parts), #y
    rec.lr, rec.y = nil, nil
    return rec
  end
  local rec
  local tool, cp, q, r, raw, ln, late, pos
  if head >= TIGHT * 16 then
    local t, g, n, c, f, flags
    t, g, n, c, f, flags, tool, pos = struct.unpack(TIGHT_HEAD, blob, 2)
    rec = {s = NAME[head - TIGHT * 16], t = t, g = g, n = n, c = c, f = f, tool = tool,
      ln = 0, lb = ''}
    for _, field in ipairs(TIGHT_FIELDS) do
      if bit.band(flags, field[2]) ~= 0 then
        rec[field[1]], pos = struct.unpack(field[3], blob, pos)
      end
    end
    if bit.band(flags, TIGHT_LATE) ~= 0 then
      rec.ln, rec.lb, pos = struct.unpack('>BI3c0', blob, pos)
    end
    rec.yn, rec.yb = string.byte(blob, pos), string.sub(blob, pos + 1)
    return rec
  end
  if head >= LIVE * 16 then
    local t, g, n, c, f, d, a, x, ra, h
    t, g, n, c, f, d, a, x, ra, h, tool, cp, q, r, raw, ln, late, pos =
      struct.unpack(LIVE_READ, blob, 2)
    rec = {s = NAME[head - LIVE * 16], t = t, g = g, n = n, c = c, f = f, d = d,
      a = nonzero(a), x = nonzero(x), ra = nonzero(ra), h = nonempty(h), tool = tool,
      cp = nonempty(cp), q = nonempty(q), r = nonempty(r), raw = nonempty(raw), ln = ln,
      lb = string.sub(blob, pos, pos + late - 1), yn = string.byte(blob, pos + late),
      yb = string.sub(blob, pos + late + 1)}
  else
    local t, g, n, c, f
    t, g, n, c, f, tool, cp, q, r, raw, ln, late, pos = struct.unpack(SETTLED_READ, blob, 2)
    rec = {s = NAME[head - SETTLED * 16], t = t, g = g, n = n, c = c, f = f, tool = tool,
      cp = nonempty(cp), q = nonempty(q), r = nonempty(r), raw = nonempty(raw), ln = ln,
      lb = string.sub(blob, pos, pos + late - 1), yn = string.byte(blob, pos + late),
      yb = string.sub(blob, pos + late + 1)}
  end
  return rec
end

-- A LIVE record's stored form, from its fields (h, cp, q, r, raw: '' when absent; a, x, ra: 0).
local function live_blob(code, t, g, n, c, f, d, a, x, ra, h, tool, cp, q, r, raw, ln, lb, yn, yb)
  return struct.pack(LIVE_FORMAT, LIVE * 16 + code, t, g, n, c, #f, f, d, a, x, ra, #h, h,
    #tool, tool, #cp, cp, #q, q, #r, r, #raw, raw, ln, #lb) .. lb .. string.char(yn) .. yb
end

local function encode(rec)
  if rec.s == 'DONE' and rec.yn > DONE_HISTORY then
    rec.yb, rec.yn = trim(rec.yb, rec.yn, DONE_HISTORY, STEP)
  end
  local tool, cp, q, r, raw = rec.tool, rec.cp or '', rec.q or '', rec.r or '', rec.raw or ''
  -- attempts saturate at 65535: a count for people, never compared
  local n, lb = math.min(rec.n, 65535), rec.lb
  if rec.d then
    return live_blob(CODE[rec.s], rec.t, rec.g, n, rec.c, rec.f, rec.d, rec.a or 0, rec.x or 0,
      rec.ra or 0, rec.h or '', tool, cp, q, r, raw, rec.ln, lb, rec.yn, rec.yb)
  end
  if compact and #rec.f == 32 then
    local flags, parts = 0, {}
    for _, field in ipairs(TIGHT_FIELDS) do
      local v = rec[field[1]]
      if v and v ~= '' then
        flags = flags + field[2]
        parts[#parts + 1] = struct.pack(field[3], #v, v)
      end
    end
    if rec.ln > 0 then
      flags = flags + TIGHT_LATE
      parts[#parts + 1] = struct.pack('>BI3', rec.ln, #lb) .. lb
    end
    return string.char(TIGHT * 16 + CODE[rec.s]) ..
      struct.pack(TIGHT_HEAD, rec.t, rec.g, n, rec.c, rec.f, flags, #tool, tool) ..
      table.concat(parts) .. string.char(rec.yn) .. rec.yb
  end
  return struct.pack(SETTLED_FORMAT, SETTLED * 16 + CODE[rec.s], rec.t, rec.g, n, rec.c,
    #rec.f, rec.f, #tool, tool, #cp, cp, #q, q, #r, r, #raw, raw, rec.ln, #lb)
    .. lb .. string.char(rec.yn) .. rec.yb
end

local COUNTED = {CLAIMED = true, RECONCILING = true, UNKNOWN = true}

local function count(state, delta)
  if state and COUNTED[state] then
    redis.call('HINCRBY', K[3], state .. ':' .. rec.tool, delta)
  end
end

-- Move rec to `state`, keeping counts, lease index and history in step with it.
local function move(state, token, note, deadline)
  if rec.s == 'UNKNOWN' and state ~= 'UNKNOWN' then redis.call('ZREM', K[5], key) end
  if state == 'UNKNOWN' then redis.call('ZADD', K[5], now, key) end
  count(rec.s, -1)
  if rec.cp then
    if rec.s then redis.call('HINCRBY', K[6], rec.cp .. ':' .. rec.s, -1) end
    redis.call('HINCRBY', K[6], rec.cp .. ':' .. state, 1)
  end
  note = note or ''
  if compact and note == DEFAULT_NOTE[CODE[state]] then note = '' end
  -- The distance is 0 or 1 but at a fresh record (rec.t 0), where nothing reads it.
  rec.yb = rec.yb .. struct.pack(STEP, CODE[state], math.min(token - rec.t, 255), now, #note, note)
  rec.s = state
  rec.t = token
  count(state, 1)
  rec.yn = rec.yn + 1
  if rec.yn > HISTORY then rec.yb, rec.yn = trim(rec.yb, rec.yn, HISTORY, STEP) end
  if state ~= 'RECONCILING' then
    rec.x, rec.ra = nil, nil
  end
  if deadline then
    rec.d = deadline
    redis.call('ZADD', K[2], deadline, key)
  else
    -- Settled: lease, holder and claim time matter no more (a DONE record stays small).
    rec.d, rec.h, rec.a = nil, nil, nil
    redis.call('ZREM', K[2], key)
  end
end

local function floor()
  return tonumber(redis.call('GET', K[7]) or '0')
end

local function save(retention_ms)
  if retention_ms and retention_ms > 0 then
    -- The record may expire: remember its token, so the key's next record starts above it.
    if floor() < rec.t then redis.call('SET', K[7], rec.t) end
    redis.call('SET', K[1], encode(rec), 'PX', retention_ms)
  else
    redis.call('SET', K[1], encode(rec))
  end
  -- Read under its other name: it moves (never two copies to disagree).
  if stored ~= K[1] then redis.call('DEL', stored) end
end

local function fenced(name)
  redis.call('HINCRBY', K[3], 'fenced:' .. name, 1)
  if rec then return {'fenced', rec.s, rec.t} end
  return {'fenced', 'ABSENT', 0}
end

local function bump(name, tool)
  redis.call('HINCRBY', K[3], name .. ':' .. tool, 1)
end

local function refused()
  if rec then return {'refused', rec.s, rec.t} end
  return {'refused', 'ABSENT', 0}
end

-- claim(fingerprint (binary), tool, lease_ms, holder, request, campaign tag or '', generation)
-- `generation` is the one the message was submitted for (submit's answer, carried by the
-- envelope): only a submission or replay made after a revoke may open the next generation.
--   any state, generation < g: a message of a voided generation never runs and never
--              rewrites the record, whatever the state (DESIGN §2)  => duplicate('')
--   none                                   -> CLAIMED, token INCR floor => acquired
--   FAILED (generation >= g): known not executed, so this generation's key is free for
--              any values; fingerprint and request become this message's
--                                          -> CLAIMED, token+1        => acquired
--   REVOKED | SUPERSEDED, generation > g   -> CLAIMED g+1, token+1    => acquired
--   REVOKED | SUPERSEDED, generation = g: a message of the voided generation
--                                                                     => duplicate(receipt)
--   otherwise: fingerprint differs                                    => conflict
--   DONE                                                              => duplicate(receipt)
--   CLAIMED with a live lease, RECONCILING                            => in_flight
--   CLAIMED with an expired lease, UNKNOWN                            => blocked
-- in_flight / blocked end with the ms to the lease deadline (negative once it has passed;
-- nil without one: UNKNOWN), so a worker backs off towards it.
-- submitted_ms (ARGV[10]): the ledger's time when the message was submitted (submit's
-- answer, carried by the message; 0: not known), window_ms (ARGV[11]): the provider's
-- idempotency window. Where a claim would be granted (nothing else reads the provider's
-- memory of the key), a message older than the window by this clock is refused:
--                                                                     => stale(age ms)
-- the provider may have forgotten the key, so running it would be a fresh effect.
OPS.claim = function()
  local fp, tool, lease_ms, holder, request = A[3], A[4], tonumber(A[5]), A[6], A[7]
  local campaign = A[8] ~= '' and A[8] or nil
  local generation = tonumber(A[9]) or 0
  local submitted, window = tonumber(A[10]) or 0, tonumber(A[11]) or 0
  local function stale()
    if submitted > 0 and window > 0 and now - submitted > window then
      return {'stale', rec and rec.s or 'ABSENT', rec and rec.t or 0, now - submitted}
    end
  end
  if not rec then
    clock()
    local deadline = now + lease_ms
    local too_old = stale()
    if too_old then return too_old end
    -- A record that expired took its generation along: the message's (submit's answer)
    -- keeps the provider's idempotency key the one its generation was submitted under.
    -- The floor's INCR is the token, and the floor already covers it when the record is
    -- saved with a TTL (its commit reads the floor and writes nothing to it).
    local token = redis.pcall('INCR', K[7])
    if type(token) ~= 'number' then
      -- Refused: an ACL line written before this release grants no INCR. GET + SET do the
      -- same, one command more, rather than every first claim failing after an upgrade.
      token = floor() + 1
      redis.call('SET', K[7], token)
    end
    -- What move('CLAIMED', ...) and encode() make of a fresh record, written directly: the
    -- first claim of every effect goes without a record table (~5 % of a claim + commit's
    -- script time, tests/bench/ledger_bench.py in situ).
    if campaign then redis.call('HINCRBY', K[6], campaign .. ':CLAIMED', 1) end
    redis.call('HINCRBY', K[3], 'CLAIMED:' .. tool, 1)
    redis.call('ZADD', K[2], deadline, key)
    local note = compact and '' or 'claim'
    local step = struct.pack(STEP, CODE.CLAIMED, math.min(token, 255), now, #note, note)
    redis.call('SET', K[1], live_blob(CODE.CLAIMED, token, generation, 1, now, fp, deadline, now,
      0, 0, holder, tool, campaign or '', request, '', '', 0, '', 1, step), 'NX')
    return {'acquired', token, generation}
  end
  local s = rec.s
  if generation < rec.g then
    bump('dup_claim', tool)
    return {'duplicate', rec.t, generation, '', s}
  end
  if (s == 'REVOKED' or s == 'SUPERSEDED') and generation == rec.g then
    bump('dup_claim', tool)
    return {'duplicate', rec.t, rec.g, rec.r or '', s}
  end
  if s == 'FAILED' or s == 'REVOKED' or s == 'SUPERSEDED' then
    clock()
    local deadline = now + lease_ms
    local too_old = stale()
    if too_old then return too_old end
    if s ~= 'FAILED' then rec.g = rec.g + 1 else rec.g = generation end
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
  clock()
  local remaining = rec.d and rec.d - now or false
  if s == 'RECONCILING' or (s == 'CLAIMED' and rec.d > now) then
    return {'in_flight', s, rec.t, remaining}
  end
  return {'blocked', s, rec.t, remaining}
end

-- heartbeat(token, lease_ms): the holder of CLAIMED or RECONCILING under `token` extends
-- its lease (the reconciler uses it to "look again later"). Stale token => fenced.
OPS.heartbeat = function()
  local token, lease_ms = tonumber(A[3]), tonumber(A[4])
  if not rec or rec.t ~= token or (rec.s ~= 'CLAIMED' and rec.s ~= 'RECONCILING') then
    return fenced('heartbeat')
  end
  rec.d = now + lease_ms
  redis.call('ZADD', K[2], rec.d, key)
  save(0)
  return {'ok', rec.s, rec.t}
end

-- commit(token, receipt, raw, retention_ms, note): CLAIMED | RECONCILING under `token`
-- -> DONE. A retry of the same commit is ok. Stale token => fenced, and the receipt is kept
-- in late receipts as evidence (never as authority). On FAILED that evidence contradicts
-- the record ("known not executed"): FAILED -> UNKNOWN under token+1, which blocks every
-- claim and replay until an operator resolves it.
OPS.commit = function()
  local token, receipt, raw, retention_ms = tonumber(A[3]), A[4], A[5], tonumber(A[6])
  if rec and rec.t == token and rec.s == 'DONE' then return {'ok', 'DONE', token} end
  if not rec or rec.t ~= token or (rec.s ~= 'CLAIMED' and rec.s ~= 'RECONCILING') then
    if rec then
      -- The late receipts' total length is a three-byte field: a receipt that cannot fit
      -- even alone is kept as its size (the evidence is that it came, not its text), and
      -- the oldest go until the list fits.
      if #receipt > LATE_BYTES - 15 then
        receipt = cjson.encode({effectq_late_receipt_bytes = #receipt})
      end
      rec.lb = rec.lb .. struct.pack(LATE_ENTRY, token, #receipt, receipt, now)
      rec.ln = rec.ln + 1
      if rec.ln > LATE then rec.lb, rec.ln = trim(rec.lb, rec.ln, LATE, LATE_ENTRY) end
      while #rec.lb > LATE_BYTES do
        rec.lb, rec.ln = trim(rec.lb, rec.ln, rec.ln - 1, LATE_ENTRY)
      end
      if rec.s == 'FAILED' then
        move('UNKNOWN', rec.t + 1, 'late receipt after FAILED', nil)
        save(0)
      else
        local ttl = redis.call('PTTL', stored)
        save(ttl > 0 and ttl or 0)
      end
    end
    return fenced('commit')
  end
  rec.r, rec.q = receipt, nil
  if raw ~= '' then rec.raw = raw end
  move('DONE', token, A[7], nil)
  save(retention_ms)
  redis.call('DEL', K[4])
  return {'ok', 'DONE', token}
end

-- fail(token, reason, retention_ms): CLAIMED | RECONCILING under `token` -> FAILED: known
-- not executed. The key is free again: the next claim is granted.
OPS.fail = function()
  local token, reason, retention_ms = tonumber(A[3]), A[4], tonumber(A[5])
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
OPS.handover = function()
  local token, reason = tonumber(A[3]), A[4]
  if not rec or rec.t ~= token or rec.s ~= 'CLAIMED' then return fenced('handover') end
  move('CLAIMED', token, 'handover: ' .. reason, now)
  save(0)
  return {'ok', 'CLAIMED', token}
end

-- takeover(lease_ms, holder): CLAIMED or RECONCILING whose lease has expired -> RECONCILING
-- under token+1. Returns what the reconciler needs to ask the provider and to judge the
-- answer: when the claim was granted, when reconciliation began, how many takeovers so far.
OPS.takeover = function()
  local lease_ms, holder = tonumber(A[3]), A[4]
  if not rec or (rec.s ~= 'CLAIMED' and rec.s ~= 'RECONCILING') or rec.d > now then
    -- A stale index entry (record gone or settled) is dropped here, not by a scan.
    if not rec or (rec.s ~= 'CLAIMED' and rec.s ~= 'RECONCILING') then
      redis.call('ZREM', K[2], key)
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
    cjson.encode(late_list(rec)), since, rounds, now,
  }
end

-- unknown(token, reason): RECONCILING under `token` -> UNKNOWN: the outcome cannot be
-- established; every claim is blocked until an operator resolves it with evidence.
OPS.unknown = function()
  local token, reason = tonumber(A[3]), A[4]
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
OPS.operate = function()
  local action, note, retention_ms = A[3], A[4], tonumber(A[5])
  local rule = OPERATOR[action]
  if not rule then return redis.error_reply('unknown operator action ' .. action) end
  if not rec or rec.s ~= rule.from then return refused() end
  if action == 'resolve_failed' and rec.ln > 0 and A[8] ~= '1' then
    return {'refused', rec.s, rec.t, rec.ln}
  end
  if rule.to == 'DONE' then
    rec.r, rec.q = A[6], nil
    if A[7] ~= '' then rec.raw = A[7] end
  end
  move(rule.to, rec.t + 1, note, nil)
  save(retention_ms)
  return {'ok', rule.to, rec.t}
end

-- recheck(tool, note, holder): an operator sends an UNKNOWN effect of `tool` back to the
-- reconciler (a bulk re-check after a lookup outage): UNKNOWN -> RECONCILING under token+1
-- with its lease already expired, so the next reconciler pass takes it over and asks the
-- provider again. The takeover count and the reconciliation start are cleared: a fresh
-- lookup budget, and the settle window counts from that takeover (decide() as usual).
-- Any other state, or another tool's record => refused.
OPS.recheck = function()
  local tool, note, holder = A[3], A[4], A[5]
  if not rec or rec.s ~= 'UNKNOWN' or rec.tool ~= tool then return refused() end
  move('RECONCILING', rec.t + 1, note, now)
  rec.h, rec.x, rec.ra = holder, nil, nil
  save(0)
  return {'ok', 'RECONCILING', rec.t}
end

-- submit(fingerprint (binary), tool, pending_ms, message_id, force, fingerprint in hex): may
-- the producer enqueue?
-- force = '1' (a campaign re-submission) enqueues despite a pending marker: that message
-- may have been lost, and a second message for one effect is harmless (the claim decides).
-- Reads the record, writes only the pending marker and counters: not a state transition.
-- Every answer is {status, state, token, receipt or '', generation, now, message id}:
-- the generation a message enqueued now is submitted for (the claim compares it): the
-- record's, or g+1 on REVOKED / SUPERSEDED (a submission after a revoke opens the next
-- generation), 0 if none; the server's time, which the message carries so that its age is
-- judged on this clock (claim's submitted_ms), not on the producer's; and the confirmed
-- marker's message id when that marker is why the answer is pending ('' otherwise).
--   DONE, same fingerprint                        => done(receipt)
--   fingerprint differs (and the key is held)     => conflict
--   CLAIMED with a live lease, RECONCILING        => pending (a worker has it)
--   CLAIMED with an expired lease, UNKNOWN        => blocked (awaiting reconciliation/operator)
--   none | FAILED | REVOKED | SUPERSEDED: a live pending marker with another fingerprint
--                                   => conflict; with this one, confirmed => pending
--                                   (enqueue when it is this message id's own), only
--                                   reserved => enqueue; none => enqueue
OPS.submit = function()
  local fp, tool, pending_ms, message_id = A[3], A[4], tonumber(A[5]), A[6]
  local force = A[7] == '1'
  local s = rec and rec.s
  local generation = 0
  if rec then generation = (s == 'REVOKED' or s == 'SUPERSEDED') and rec.g + 1 or rec.g end
  local function answer(status, receipt, holder)
    return {status, s or 'ABSENT', rec and rec.t or 0, receipt or '', generation, now,
      holder or ''}
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
  local marker = redis.call('GET', K[4])
  -- The marker names the fingerprint in hex (ARGV[8]), as markers written before the
  -- binary record format did: a marker outlives an upgrade.
  local fph = A[8]
  local own = fph .. '|' .. message_id
  if marker and string.sub(marker, 1, #fph + 1) ~= fph .. '|' then
    bump('conflict', tool)
    return answer('conflict')
  end
  -- Only a marker the broker's acceptance confirmed stands for a message. A reservation
  -- may never become one (its producer died, or heard "unavailable" and submits again
  -- under a new id): this submission is enqueued too, and the claim makes a second
  -- message a duplicate. A repeat of this very submission (a retried call whose reply was
  -- lost) answers as the first did: submit is safe to repeat per message id.
  if marker and not force and marker ~= own and string.sub(marker, -#RESERVED) ~= RESERVED then
    bump('dup_submit', tool)
    -- The message the marker stands for: the producer may ask the broker whether it still
    -- holds it (a broker that forgot leaves a marker standing for nothing).
    return answer('pending', nil, string.sub(marker, #fph + 2))
  end
  if marker ~= own then redis.call('SET', K[4], own .. RESERVED, 'PX', pending_ms) end
  return answer('enqueue')
end

-- confirm(message id, fingerprint hex, pending_ms): the broker accepted the message whose
-- submit reserved the marker: the reservation becomes the marker that answers "pending",
-- for pending_ms. Only that reservation (or that confirmed marker: a confirm sent twice).
-- A marker that is gone (lapsed, cleared by a commit) or another message's stays as it is:
-- a confirm that lands late, after its message ran, never stands for a later submission.
-- It touches the marker alone, so run() sends it on before reading the clock or the record
-- (a producer confirms every message it sends; a campaign, a thousand a batch).
MARKER_OPS.confirm = function()
  local own = A[4] .. '|' .. A[3]
  local marker = redis.call('GET', K[4])
  if marker ~= own .. RESERVED and marker ~= own then return 0 end
  redis.call('SET', K[4], own, 'PX', tonumber(A[5]))
  return 1
end

-- get(): the record as the JSON object of the format before this one (fingerprint in hex)
-- and its PTTL, or nil: the one reader of the stored form is this script.
OPS.get = function()
  if not rec then return false end
  rec.f, rec.y = hex(rec.f), history(rec)
  if rec.ln > 0 then rec.lr = late_list(rec) end
  rec.lb, rec.ln, rec.yb, rec.yn = nil, nil, nil, nil
  return {cjson.encode(rec), redis.call('PTTL', stored)}
end

-- The entry point: KEYS and ARGV as above. ledger.py ends the file with the call that
-- fits the server: `return run(KEYS, ARGV)` for EVALSHA, or the registration of `run` as
-- a Redis Function.
local function run(keys, args)
  K, A = keys, args
  key = A[2]
  local marker_op = MARKER_OPS[A[1]]
  if marker_op then return marker_op() end
  now = nil
  if not LAZY_CLOCK[A[1]] then clock() end
  stored = K[1]
  -- A ledger writing short names (KEYS[1] the shorter spelling) writes the tight form too:
  -- no release before short names runs on its namespace (format 2, dedupe/checks.py).
  compact = K[8] ~= nil and #K[1] < #K[8]
  local blob
  if K[8] then
    -- Both names in one command (a miss under KEYS[1] is every fresh claim). An ACL line
    -- written before this release may grant no MGET: two GETs do the same.
    local both = redis.pcall('MGET', stored, K[8])
    if both.err then both = {redis.call('GET', stored), redis.call('GET', K[8])} end
    blob = both[1]
    if not blob and both[2] then blob, stored = both[2], K[8] end
  else
    blob = redis.call('GET', stored)
  end
  rec = blob and decode(blob) or nil
  local op = OPS[A[1]]
  if not op then return redis.error_reply('unknown ledger op ' .. tostring(A[1])) end
  return op()
end

