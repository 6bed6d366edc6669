"""Every Redis key name the ledger, the campaign store and the operator reads use, spelled
once (arq keeps its prefixes in one ``constants.py`` the same way). A name here is stored
data: changing one is a layout change (UPGRADING, "settings that must never change").

Per effect, under its bucket's hash tag ``{<ns>:<bucket>}`` (one slot, Cluster-safe; the
bucket is the key's first 8 hex digits modulo the bucket count):

    {<ns>:<b>}:r:<name>        the record                  (ledger.lua KEYS[1]; KEYS[8]
                               names the same record in the other spelling)
    {<ns>:<b>}:p:<key>         the pending marker          (KEYS[4])
    {<ns>:<b>}:audit:<key>     the effect's audit trail    (stream)

A record's ``<name>`` is its key's 32 bytes in unpadded base64url (43 characters: 32 bytes
of ``MEMORY USAGE`` less per record, the key's allocation falling from jemalloc's 96-byte
class to its 64-byte one) in a namespace the version record names ``short``
(every namespace laid out by this release), and the 64 hex digits themselves in one laid
out before (``hex``). The ledger script reads a record under either spelling and moves it
to its own on a write, so a ledger that writes one spelling never misses a record written
in the other (``KeySpace.script_keys``).

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

Per Redis: ``effectq:ledger`` (``SCHEMA_KEY``), the version record: ``format``,
``ns:<namespace>`` -> bucket count for every namespace on it, and ``names:<namespace>`` ->
``short`` for a namespace whose records are written under short names.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field

from .identity import KEY_OR_PREFIX

__all__ = [
    "FOREIGN_PATTERNS",
    "SCHEMA_KEY",
    "SCHEMA_NAMES",
    "SCHEMA_NAMESPACE",
    "KeySpace",
    "effect_key_of",
    "schema_field",
    "short_name",
]

#: The ledger's version record: one per Redis (every namespace on it), never expires.
SCHEMA_KEY = "effectq:ledger"
#: The prefix of the version record's namespace fields.
SCHEMA_NAMESPACE = "ns:"
#: The prefix of the version record's fields naming a namespace's record spelling.
SCHEMA_NAMES = "names:"
_URLSAFE = bytes.maketrans(b"+/", b"-_")
#: The base64url alphabet, in order (a hex prefix's last digit narrows a name's character
#: to a range of it).
_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
#: SCAN patterns that find another namespace's keys: the previous release's layout key,
#: and any bucket's keys.
FOREIGN_PATTERNS = ("*:layout", "{*:*}:*")


def schema_field(namespace: str) -> str:
    """The version record's field holding ``namespace``'s bucket count."""
    return SCHEMA_NAMESPACE + namespace


def short_name(key: str) -> str:
    """A record's short name: ``key``'s 32 bytes in unpadded base64url; a key that is no
    SHA-256 in lowercase hex (only tests make such keys) keeps its own spelling. (Every
    ledger call spells it: binascii and a translation, a third of base64's urlsafe path.)"""
    if len(key) == 64:
        try:
            raw = bytes.fromhex(key)
        except ValueError:
            return key
        if raw.hex() == key:  # lowercase, nothing between the digits
            return binascii.b2a_base64(raw, newline=False)[:43].translate(_URLSAFE).decode()
    return key


def effect_key_of(name: str) -> str:
    """The effect key a record's name (its part after ``:r:``) spells, in either form (a
    43-character hex key, which only a test could make, reads as itself)."""
    if len(name) != 43 or KEY_OR_PREFIX.fullmatch(name):
        return name
    try:
        return base64.b64decode(name + "=", altchars=b"-_", validate=True).hex()
    except ValueError:
        return name


def _short_prefix_pattern(prefix: str) -> str:
    """A SCAN pattern for the short names of keys starting with hex ``prefix``: every three
    hex digits are two base64url characters; of one or two digits left over, the first fixes
    the top 4 bits of the next character, a range of the alphabet (the caller filters the
    names found on the whole prefix)."""
    whole = len(prefix) - len(prefix) % 3
    head = base64.urlsafe_b64encode(bytes.fromhex(prefix[:whole] + "0" * (whole % 2)))
    pattern = head.decode().rstrip("=")[: whole // 3 * 2]
    rest = prefix[whole:]
    if rest:
        bits = int(rest[0], 16)
        first = _B64[bits * 4 : bits * 4 + 4]  # the top 4 of 6 bits
        pattern += "[" + first.replace("-", "\\-") + "]"  # '-' alone would make a range
    return pattern + "*"


@dataclass(frozen=True)
class KeySpace:
    """The key names of one namespace laid out in ``buckets`` buckets."""

    namespace: str
    buckets: int
    #: Records written under short names (``short_name``), else under the hex key.
    short: bool = False
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
        # KEYS[1] the spelling this ledger writes, KEYS[8] the other (read on a miss).
        short = record + short_name(key)
        mine, other = (short, record + key) if self.short else (record + key, short)
        return [mine, leases, stats, pending + key, unknown, campaigns, floor, other]

    def pending(self, key: str) -> str:
        """``script_keys(key)[3]`` alone."""
        return f"{self.tag(self.bucket_of(key))}:p:{key}"

    def trail(self, key: str) -> str:
        """Effect ``key``'s own audit trail."""
        return f"{self.tag(self.bucket_of(key))}:audit:{key}"

    def index(self, bucket: int, name: str) -> str:
        """A bucket's ``leases``, ``unknown``, ``stats`` or ``campaigns`` key."""
        return f"{self.tag(bucket)}:{name}"

    def records_with_prefix(self, prefix: str) -> list[str]:
        """SCAN patterns: the records whose key starts with ``prefix`` (>= 8 hex digits),
        hex-named and short-named (the short pattern may match a few more: filter on
        ``effect_key_of``)."""
        tag = self.tag(self.bucket_of(prefix))
        return [f"{tag}:r:{prefix}*", f"{tag}:r:{_short_prefix_pattern(prefix)}"]

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
