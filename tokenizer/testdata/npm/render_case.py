"""Writes what Python and jinja2 make of strings' case, the expectations of
TestPyCaseMatchesPython (pycase.go): for each string, str.upper, lower,
title, capitalize and swapcase, and jinja2's upper, lower, title and
capitalize filters rendered in render_chats.py's environment.

The strings are random (seeded, so the file is the same each run) over
characters chosen to test full case mappings and contexts: special
casings, titlecase digraphs, Greek sigma among cased and case-ignorable
characters, jinja2's title separators, Python's white space, and a share
of any character assigned in Python's Unicode database. Only characters
this Python's Unicode version assigns are drawn.

pycase.go's tables are Go's (Unicode 15.0.0 with Go 1.26): Python 3.12
has the same version; 3.11 (14.0.0) differs on five modifier letters
(TestPyCaseMatchesPython), which the committed strings do not hold.

Usage:
  python3 render_case.py strings <count> <out.json>
  python3 render_case.py codepoints <out.json>

"codepoints" writes, for every assigned code point c, the strings c,
c+"a", "aΣ"+c+"b" and c+"Σ": the mappings of c, whether str.title takes
c as cased, and whether final sigma takes it as case-ignorable or cased.
Those rows have the str methods alone (the filters map characters with
the same functions). It is a one-off check of the tables (some hundred
megabytes), not a fixture.
"""
import json
import random
import sys
import unicodedata

import jinja2

from render_chats import environment

SPECIAL = (
    "ßẞﬀﬁﬂﬃﬄﬅﬆﬓﬔﬕﬖﬗŉǰΐΰևẖẗẘẙẚὐὒὔὖᾀᾈᾳᾼῃῌῳῼᾶῆῖῦῶİıiIǄǅǆǇǈǉǊǋǌǱǲǳ"
    "ΣσςΌΟΆάΐΪΫΰϐϑϕϖϰϱϵ"
    "ⓐⒶⅰⅠªºʰˀᵃͅ\u0301\u0307\u0308\u0345\u00ad\u200d\u200b\u2019\u2018'.:·\u0387\u2027\uff0e"
    "-({[<)}]>_,;!?\"\\/ \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f\x85\xa0\u1680\u2000\u2028\u3000"
    "aAzZ09é ÉñÑøØæÆœŒĳĲ𐐀𐐨𞤀𞤢ႠⴀᲐაꭰᎠДдЁёԱաḀḁÿŸ漢字😀"
)

# Case-ignorable characters (marks, format characters, modifier letters and
# symbols, and the word-break characters Unicode counts in), which final
# sigma looks past.
IGNORABLE = "\u0301\u0345\u00ad\u200d'.:\u00b7\u2019\u02b0\u02c2\u00b4\u0483\u0488"


def draw_pool(rng):
    assigned = [c for c in map(chr, range(0x110000))
                if unicodedata.category(c) not in ("Cn", "Cs")]
    special = [c for c in SPECIAL if unicodedata.category(c) != "Cn"]

    def draw():
        x = rng.random()
        if x < 0.2:
            return rng.choice(assigned)
        if x < 0.3:
            return "Σ"
        if x < 0.4:
            return rng.choice(IGNORABLE)
        return rng.choice(special)
    return draw


def outputs(strings, with_filters=True):
    env = environment()
    names = ("upper", "lower", "title", "capitalize") if with_filters else ()
    filters = {name: env.from_string("{{ s|%s }}" % name) for name in names}
    rows = []
    for s in strings:
        row = {"s": s, "upper": s.upper(), "lower": s.lower(), "title": s.title(),
               "capitalize": s.capitalize(), "swapcase": s.swapcase()}
        for name, t in filters.items():
            row[name + "_filter"] = t.render(s=s)
        rows.append(row)
    return {"python": sys.version.split()[0], "unicode": unicodedata.unidata_version,
            "jinja2": jinja2.__version__, "cases": rows}


def main():
    mode = sys.argv[1]
    if mode == "strings":
        rng = random.Random(20261205)
        draw = draw_pool(rng)
        strings = ["".join(draw() for _ in range(rng.randint(0, 12))) for _ in range(int(sys.argv[2]))]
        out = sys.argv[3]
    elif mode == "codepoints":
        strings = []
        for cp in range(0x110000):
            c = chr(cp)
            if unicodedata.category(c) not in ("Cn", "Cs"):
                strings += [c, c + "a", "aΣ" + c + "b", c + "Σ"]
        out = sys.argv[2]
    else:
        sys.exit(__doc__)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(outputs(strings, mode == "strings"), f, ensure_ascii=False, indent=0)
        f.write("\n")


if __name__ == "__main__":
    main()
