"""Every Redis key name the ledger, the campaign store and the operator reads use, spelled
once (arq keeps its prefixes in one ``constants.py`` the same way). A name here is stored
data: changing one is a layout change (UPGRADING, "settings that must never change").

Per effect, under its bucket's hash tag ``{<ns>:<bucket>}`` (one slot, Cluster-safe; the
bucket is the key's first 8 hex digits modulo the bucket count):

    {<ns>:<b>}:r:<key>         the record                  (ledger.lua KEYS[1])
    {<ns>:<b>}:p:<key>         the pending marker          (KEYS[4])
    {<ns>:<b>}:audit:<key>     the effect's audit trail    (stream)

Per bucket: ``{<ns>:<b>}:leases``, ``:stats``, ``:unknown``, ``:campaigns``, ``:floor``
(ledger.lua KEYS[2], 3, 5, 6, 7: its header says what each holds).

Per namespace (one slot each, outside the buckets):

    <ns>:audit                 stream: every operator action (never trimmed)
    <ns>:deadletters           stream: why each message was dead-lettered
    <ns>:<group>               zset:   a reconciler group's members by last beat
    <ns>:layout                the bucket count, as the release before versions wrote it
    <ns>:paused                hash:   paused tools and queues (``workers/broker/gate.py``)
    {<ns>:limit:<tool>}:…      a tool's rate and concurrency limiters, spelled in
                               ``workers/broker/gate.py`` (Dramatiq's limiters name them)
    <ns>:campaign:<tag>[:…]    the campaign store's keys (``dedupe/campaigns.py``), and
                               a plan's staging receipt, ``…:staged:{<plan key>}``

Per Redis: ``effectq:ledger`` (``SCHEMA_KEY``), the version record: ``format`` and
``ns:<namespace>`` -> bucket count for every namespace on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["FOREIGN_PATTERNS", "SCHEMA_KEY", "SCHEMA_NAMESPACE", "KeySpace", "schema_field"]

#: The ledger's version record: one per Redis (every namespace on it), never expires.
SCHEMA_KEY = "effectq:ledger"
#: The prefix of the version record's namespace fields.
SCHEMA_NAMESPACE = "ns:"
#: SCAN patterns that find another namespace's keys: the previous release's layout key,
#: and any bucket's keys.
FOREIGN_PATTERNS = ("*:layout", "{*:*}:*")


def schema_field(namespace: str) -> str:
    """The version record's field holding ``namespace``'s bucket count."""
    return SCHEMA_NAMESPACE + namespace


@dataclass(frozen=True)
class KeySpace:
    """The key names of one namespace laid out in ``buckets`` buckets."""

    namespace: str
    buckets: int
    # A bucket's key names, spelled at its first call (``script_keys``).
    _named: dict[int, tuple[str, ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def bucket_of(self, key: str) -> int:
        return int(key[:8], 16) % self.buckets

    def tag(self, bucket: int) -> str:
        return f"{{{self.namespace}:{bucket}}}"

    def script_keys(self, key: str) -> list[str]:
        """The keys of one ``ledger.lua`` call for effect ``key``, in its KEYS order."""
        bucket = int(key[:8], 16) % self.buckets
        named = self._named.get(bucket)
        if named is None:
            tag = self.tag(bucket)
            named = self._named[bucket] = (
                f"{tag}:r:", f"{tag}:leases", f"{tag}:stats", f"{tag}:p:", f"{tag}:unknown",
                f"{tag}:campaigns", f"{tag}:floor",
            )  # fmt: skip
        record, leases, stats, pending, unknown, campaigns, floor = named
        return [record + key, leases, stats, pending + key, unknown, campaigns, floor]

    def pending(self, key: str) -> str:
        """``script_keys(key)[3]`` alone."""
        return f"{self.tag(self.bucket_of(key))}:p:{key}"

    def trail(self, key: str) -> str:
        """Effect ``key``'s own audit trail."""
        return f"{self.tag(self.bucket_of(key))}:audit:{key}"

    def index(self, bucket: int, name: str) -> str:
        """A bucket's ``leases``, ``unknown``, ``stats`` or ``campaigns`` key."""
        return f"{self.tag(bucket)}:{name}"

    def records_with_prefix(self, prefix: str) -> str:
        """SCAN pattern: the records whose key starts with ``prefix`` (>= 8 hex digits)."""
        return f"{self.tag(self.bucket_of(prefix))}:r:{prefix}*"

    @property
    def records(self) -> str:
        """SCAN pattern: every record of the namespace."""
        return f"{{{self.namespace}:*}}:r:*"

    @property
    def markers(self) -> str:
        """SCAN pattern: every pending marker of the namespace."""
        return f"{{{self.namespace}:*}}:p:*"

    @property
    def owned(self) -> str:
        """SCAN pattern: any bucket key of the namespace."""
        return f"{{{self.namespace}:*"

    def stream(self, name: str) -> str:
        """The namespace's ``audit`` or ``deadletters`` stream."""
        return f"{self.namespace}:{name}"

    def group(self, name: str) -> str:
        """A reconciler group's membership (a sorted set)."""
        return f"{self.namespace}:{name}"

    @property
    def paused(self) -> str:
        """The paused tools and queues (a hash: ``tool:<name>`` / ``queue:<name>`` -> note)."""
        return f"{self.namespace}:paused"

    @property
    def legacy_layout(self) -> str:
        """The bucket count as the release before version records wrote it."""
        return f"{self.namespace}:layout"

    def campaign(self, tag: str, *parts: str | int) -> str:
        """A campaign store key: the meta (no ``parts``), or its plan, removed, sent, job
        keys (``dedupe/campaigns.py`` documents each)."""
        return ":".join([self.namespace, "campaign", tag, *map(str, parts)])

    def staged(self, tag: str, plan_key: str) -> str:
        """A plan's staging receipt: hash-tagged by the plan key, so it sits in its slot."""
        return f"{self.campaign(tag, 'staged')}:{{{plan_key}}}"
