"""Word lists the seeded prompt generator draws from.

Plain, common English words (mostly one BPE token each) so that prompts look like text to a
tokenizer, and identifier parts for code-like contexts.
"""

from __future__ import annotations

ENGLISH_WORDS: tuple[str, ...] = tuple(
    dict.fromkeys(
    """
    the of and to in is was for on that with as by at from it this be are an or have has had not
    but which one all were when we there can more their if will would about what some other than
    into only its time two may new first also after these any most made over such where many
    through back years could should much before between each under three never because while
    well long life work world part last still great public place small number way day people
    city state water name house school group system order point area family country power war
    money story month lot right study book eye job word business issue side kind head service
    friend father mother hour game line end member law car market report office door health
    person art history party result change morning reason research girl guy moment air teacher
    force education river light music field paper space ground form table letter island garden
    window bridge forest engine planet signal winter summer autumn spring valley harbor train
    station library museum kitchen village mountain ocean desert storm cloud stone metal glass
    road street corner shadow voice answer question problem method theory model data value
    energy motion pressure surface layer network memory process record season journey figure
    simple quiet bright early late ready clear strong simple modern ancient gentle careful
    heavy light warm cold green blue red yellow silver golden hidden open final local general
    build carry follow learn watch bring write read speak listen travel measure explain notice
    create remember describe improve prepare discover consider suggest include develop protect
    quickly slowly rarely often always almost perhaps together outside inside around toward
    """.split()
    )  # dict.fromkeys: drop repeats, keep order
)

CODE_IDENTIFIERS: tuple[str, ...] = tuple(
    """
    user order item cache buffer token batch queue stream block page index count total value
    key name path file config state event handler request response session client server
    worker task job result error status limit offset size length width height score weight
    rate step node edge graph tree list map table record field column row schema parse load
    save read write send fetch update delete create build merge split sort filter reduce apply
    """.split()
)

CODE_TYPES: tuple[str, ...] = ("int", "str", "float", "bool", "list", "dict", "bytes")
