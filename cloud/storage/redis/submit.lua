-- Accepts one contribution into a run's buffer, or refuses it, atomically: {outcome, detail}.
-- A word after a dollar sign is a placeholder, filled in with keys.py's names when it is loaded (scripts.py).
-- KEYS: the run's meta hash, idempotency key -> entry id, slot (edge:version) -> idempotency key,
--       the buffer stream, edge -> its entry still in the buffer, the contribution's blob (SET just before) or,
--       for a blob in a file, that file's tombstone (set by a sweep that deleted the file as an orphan),
--       device -> the edge holding it in the run
local meta, idempotency, slots, buffer, pending, blob = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local member_sites = KEYS[7]
-- ARGV: the submission's idempotency key, edge id, base version, header JSON,
--       '1' if the algorithm is synchronous (a contribution must be on the current version), and
--       the devices it declares, each a member at one site only (ids comma-separated; empty: none),
--       the name of the file holding the blob, written and fsynced just before (empty: the blob is KEYS[6])
local key, edge, base_version, header, synchronous = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local members, file = ARGV[6], ARGV[7]

local function refuse(outcome, detail)
  if file == '' then redis.call('DEL', blob) end  -- a refused blob's file is deleted by the caller
  return {outcome, detail}
end
local slot = edge .. ':' .. base_version
local prev = redis.call('HGET', idempotency, key)
if prev then
  if redis.call('HGET', slots, slot) == key then return refuse('duplicate', prev) end
  return refuse('key_reused', prev)
end
local status = redis.call('HGET', meta, '$status')
if status ~= '$running' and status ~= '$paused' then return refuse('not_running', status or 'missing') end
local version = tonumber(redis.call('HGET', meta, '$version'))
local base = tonumber(base_version)
if base > version then return refuse('future', tostring(version)) end
if synchronous == '1' and base ~= version then return refuse('stale', tostring(version)) end
if redis.call('HEXISTS', slots, slot) == 1 then return refuse('conflict', tostring(version)) end
if redis.call('HEXISTS', pending, edge) == 1 then return refuse('pending', tostring(version)) end
local declared = {}
for device in string.gmatch(members, '[^,]+') do table.insert(declared, device) end
local held = {}
for _, device in ipairs(declared) do
  local site = redis.call('HGET', member_sites, device)
  if site and site ~= edge then table.insert(held, device .. ':' .. site) end
end
if #held > 0 then return refuse('members_elsewhere', table.concat(held, ',')) end
local id
if file == '' then
  if redis.call('PERSIST', blob) ~= 1 then return {'lost', blob} end
  id = redis.call('XADD', buffer, '*', '$blob_key', blob, '$header', header)
else
  -- Swept as an orphan (the cloud stalled longer than the sweep's age between the write and this script).
  if redis.call('EXISTS', blob) == 1 then return {'lost', file} end
  id = redis.call('XADD', buffer, '*', '$blob_file', file, '$header', header)
end
redis.call('HSET', idempotency, key, id)
redis.call('HSET', slots, slot, key)
redis.call('HSET', pending, edge, id)
for _, device in ipairs(declared) do redis.call('HSETNX', member_sites, device, edge) end
return {'accepted', id}
