"""Appending a batch to the batch stream exactly once, even when the call is repeated.

The Redis client repeats a command whose connection failed (relayrl.runtime.redis_conn), and a
server killed after it ran the command but before its reply reached us makes that a second
run: a plain transaction would append the batch twice and the trainer would train it twice.
Here the append, the ledger entry and the acknowledgement of the batch's trajectory entries
are one script that appends nothing when every prompt of the batch is in the ledger
already; it acknowledges the entries again, which is harmless.
"""

from __future__ import annotations

import redis

from relayrl.contracts import ledger
from relayrl.contracts.keys import BUFFER_GROUP, RunKeys
from relayrl.contracts.streams import FIELD

# KEYS: batch stream, batched ledger bitmap, batched ledger's external set, trajectory stream
# ARGV: the buffer's consumer group, payload, number of scheduler prompt ids n, number of
# external ones m, the n ids (bits of the bitmap), the m ids (members of the set), then the
# trajectory entry ids (the encoding is relayrl.contracts.ledger's)
EMIT_SCRIPT = """
local n, m = tonumber(ARGV[3]), tonumber(ARGV[4])
local first_external, first_entry = 5 + n, 5 + n + m
local fresh = false
for i = 5, first_entry - 1 do
  local seen
  if i < first_external then seen = redis.call('GETBIT', KEYS[2], ARGV[i])
  else seen = redis.call('SISMEMBER', KEYS[3], ARGV[i]) end
  if seen == 0 then fresh = true break end
end
if fresh then
  redis.call('XADD', KEYS[1], '*', 'data', ARGV[2])
  for i = 5, first_external - 1 do redis.call('SETBIT', KEYS[2], ARGV[i], 1) end
  for i = first_external, first_entry - 1 do redis.call('SADD', KEYS[3], ARGV[i]) end
end
local ids = {}
for i = first_entry, #ARGV do ids[#ids + 1] = ARGV[i] end
if #ids > 0 then
  redis.call('XACK', KEYS[4], ARGV[1], unpack(ids))
  redis.call('XDEL', KEYS[4], unpack(ids))
end
if fresh then return 1 end
return 0
"""


class BatchAppender:
    def __init__(self, r: redis.Redis, keys: RunKeys):
        assert FIELD == b"data"  # EMIT_SCRIPT writes the field by name
        self.keys = keys
        self._script = r.register_script(EMIT_SCRIPT)

    def append(self, payload: bytes, prompt_ids: list[int], entry_ids: list[bytes]) -> bool:
        """Append the batch; False if it had been appended already (nothing appended)."""
        if not prompt_ids:
            raise ValueError("a batch needs at least one group")
        internal, external = ledger.split(prompt_ids)
        batched = ledger.ledger_keys(self.keys, "batched")
        reply = self._script(
            keys=[self.keys.batches, batched.bitmap, batched.external, self.keys.trajectories],
            args=[BUFFER_GROUP, payload, len(internal), len(external), *internal, *external,
                  *entry_ids])
        return bool(reply)
