"""Appending a batch to the batch stream exactly once, even when the call is repeated.

The Redis client repeats a command whose connection failed (relayrl.redis_conn), and a
server killed after it ran the command but before its reply reached us makes that a second
run: a plain transaction would append the batch twice and the trainer would train it twice.
Here the append, the ledger entry and the acknowledgement of the batch's trajectory entries
are one script that appends nothing when every prompt of the batch is in the ledger
already; it acknowledges the entries again, which is harmless.
"""

from __future__ import annotations

import redis

from relayrl.keys import BUFFER_GROUP, RunKeys
from relayrl.streams import FIELD

# KEYS: batch stream, batched ledger set, trajectory stream
# ARGV: the buffer's consumer group, payload, number of prompts n, n prompt ids, then the
# trajectory entry ids
EMIT_SCRIPT = """
local n = tonumber(ARGV[3])
local fresh = false
for i = 4, 3 + n do
  if redis.call('SISMEMBER', KEYS[2], ARGV[i]) == 0 then fresh = true break end
end
if fresh then
  redis.call('XADD', KEYS[1], '*', 'data', ARGV[2])
  for i = 4, 3 + n do redis.call('SADD', KEYS[2], ARGV[i]) end
end
local ids = {}
for i = 4 + n, #ARGV do ids[#ids + 1] = ARGV[i] end
if #ids > 0 then
  redis.call('XACK', KEYS[3], ARGV[1], unpack(ids))
  redis.call('XDEL', KEYS[3], unpack(ids))
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
        k = self.keys
        reply = self._script(keys=[k.batches, k.ledger("batched"), k.trajectories],
                             args=[BUFFER_GROUP, payload, len(prompt_ids), *prompt_ids,
                                   *entry_ids])
        return bool(reply)
