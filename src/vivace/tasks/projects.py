"""Small generated Python projects: the code the learnable task families put bugs into.

Each project is a package of one to three modules of short functions over a list of records
(dicts with a name and two numeric fields), named in one *theme*'s vocabulary (a garden's
plants and their heights, a fleet's trucks and their miles...), with a pytest file per module
whose tests are named after the function they check (`test_total_height`). Expected values
come from running the correct code on seeded inputs, several asserts per test, so a lucky
edit rarely passes.

Curriculum levels: 1 = one module, two functions; 2 = one module, four to five functions;
3 = three modules (helpers in util.py, record functions in core.py, report.py using both
through keyword arguments), so a fix can need facts from another file.

Splits are by theme: a test theme's names never appear in training. Not covered: classes,
I/O, and anything beyond the standard library.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

# theme -> (package, record noun, plural, numeric fields, unit, record names); split by theme.
THEMES: dict[str, tuple[str, str, str, tuple[str, str], str, tuple[str, ...]]] = {
    "garden": ("garden", "plant", "plants", ("height", "water"), "cm", ("fern", "basil", "ivy", "mint", "sage")),
    "fleet": ("fleet", "truck", "trucks", ("miles", "load"), "km", ("atlas", "bolt", "comet", "dart", "echo")),
    "library": ("shelf", "book", "books", ("pages", "loans"), "pages", ("dune", "emma", "ulysses", "beloved")),
    "bakery": ("bakery", "loaf", "loaves", ("weight", "price"), "g", ("rye", "spelt", "brioche", "bagel")),
    "clinic": ("clinic", "patient", "patients", ("age", "visits"), "years", ("ada", "ben", "cleo", "dev", "eli")),
    "orchard": ("orchard", "tree", "trees", ("yield_kg", "age"), "kg", ("apple", "pear", "plum", "quince")),
    "studio": ("studio", "track", "tracks", ("seconds", "plays"), "s", ("intro", "verse", "bridge", "outro")),
    "harbor": ("harbor", "ship", "ships", ("tonnage", "crew"), "t", ("aurora", "brig", "coral", "delta")),
    "school": ("school", "pupil", "pupils", ("score", "absences"), "points", ("ann", "bo", "cy", "di", "ed")),
    "farm": ("farm", "field", "fields", ("acres", "rainfall"), "acres", ("north", "south", "east", "west")),
    "gym": ("gym", "member", "members", ("workouts", "minutes"), "min", ("kim", "lee", "max", "ola", "pat")),
    "cellar": ("cellar", "bottle", "bottles", ("vintage", "stock"), "bottles", ("merlot", "rioja", "tokaj")),
    # validation
    "museum": ("museum", "exhibit", "exhibits", ("visitors", "rooms"), "visitors", ("mummy", "vase", "mask")),
    "zoo": ("zoo", "animal", "animals", ("meals", "weight"), "kg", ("lion", "otter", "panda", "zebra")),
    # test
    "kitchen": ("kitchen", "recipe", "recipes", ("grams", "servings"), "g", ("stew", "soup", "pie", "salad")),
    "observatory": ("observatory", "star", "stars", ("distance", "brightness"), "ly", ("vega", "rigel", "deneb")),
    "airport": ("airport", "flight", "flights", ("delay", "seats"), "min", ("ba12", "lh40", "af77", "kl09")),
    "brewery": ("brewery", "batch", "batches", ("litres", "days"), "l", ("pale", "stout", "lager", "porter")),
}
THEME_SPLITS = {"museum": "validation", "zoo": "validation",
                "kitchen": "test", "observatory": "test", "airport": "test", "brewery": "test"}  # fmt: skip

# Local names vary between projects so a model learns to copy them, not to remember them.
SYNONYMS = {
    "acc": ("total", "acc", "result", "running"),
    "count": ("count", "n", "hits", "tally"),
    "limit": ("limit", "threshold", "cutoff", "bound"),
    "low": ("low", "lo", "minimum", "floor"),
    "high": ("high", "hi", "maximum", "ceiling"),
    "value": ("value", "amount", "x", "raw"),
    "best": ("best", "top", "winner", "chosen"),
    "out": ("result", "out", "found", "selected"),
    "part": ("part", "amount", "piece", "portion"),
    "whole": ("whole", "total", "base", "overall"),
}


# Generated training themes ("gen-N"): with only the named themes a small model remembers their
# package names instead of copying the path a traceback shows; thousands of name combinations
# make copying the only way. No word here is in a validation or test theme.
_PACKAGES = """acme atlas beacon cobalt delta ember fable grove harbinger indigo juniper kestrel lumen meadow
nimbus onyx pylon quarry raven summit tundra umber vortex willow yarrow zephyr anvil bramble cinder
dune flint glacier hollow ingot jasper kiln lagoon marble nectar opal prairie quill ridge spruce
thistle valley walnut basin canyon fjord geyser island mesa oasis plateau reef savanna""".split()
_NOUNS = """widget gadget parcel ticket badge token sensor valve pump gear lever socket panel cable crate
pallet barrel bucket ladder lantern candle mirror pillow blanket basket kettle teapot saucer ribbon
button marble pebble shell feather acorn pinecone leaf petal seed sprout root branch stone brick
tile plank beam rivet bolt screw hinge latch drawer shelf cabinet locker vault coin medal trophy
poster banner flag kite balloon rocket drone robot engine motor turbine battery magnet lens prism""".split()
_FIELDS = """size cost count level depth width length mass speed score rating rank volume budget quota
stock height price value points hours minutes units charge power energy heat pressure
capacity duration margin balance limit total amount""".split()
_PEOPLE = """alba bruno carla dario elio fina gino hana ivo jana kai lina milo nora otto pia quinn rosa
sami tara umi vera wim xena yuri zoe arlo bea cato dina enzo fay gus ines jon kira leo mona nils
oli pau rei sol teo una""".split()
_UNITS = "kg g m cm km l ml h min s pts units eur usd kwh".split()


def generated_theme(n: int) -> tuple[str, str, str, tuple[str, str], str, tuple[str, ...]]:
    rng = random.Random(f"theme-{n}")
    held_out = {w for t, spec in THEMES.items() if split_of_theme(t) != "train" for w in _theme_words(spec)}

    def pick(words: list[str], invented: float) -> str:
        # Invented words cannot be remembered from training, only copied from what the tools show.
        while (w := _invent(rng) if rng.random() < invented else rng.choice(words)) in held_out:
            pass
        return w

    item = pick(_NOUNS, 0.5)
    items = item[:-1] + "ies" if item.endswith("y") and item[-2] not in "aeiou" else item + "s"
    f = pick(_FIELDS, 0.5)
    while (o := pick(_FIELDS, 0.5)) == f:
        pass
    return pick(_PACKAGES, 0.7), item, items, (f, o), rng.choice(_UNITS), tuple(rng.sample(_PEOPLE, 5))


def _invent(rng: random.Random) -> str:
    """A pronounceable made-up word of 2-3 syllables ("tovika", "brelun")."""
    onsets, vowels, codas = "b d f g k l m n p r s t v z br dr gr kl pl st tr".split(), "aeiou", ["", "", "n", "r", "l"]
    return "".join(rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas) for _ in range(rng.choice((2, 2, 3))))


def _theme_words(spec: tuple) -> tuple[str, ...]:
    return (spec[0], spec[1], spec[2], *spec[3])


def theme_spec(theme: str) -> tuple[str, str, str, tuple[str, str], str, tuple[str, ...]]:
    return generated_theme(int(theme.removeprefix("gen-"))) if theme.startswith("gen-") else THEMES[theme]


def split_of_theme(theme: str) -> str:
    return THEME_SPLITS.get(theme, "train")


@dataclass
class Names:
    pkg: str
    item: str
    items: str
    field: str
    other: str  # the second numeric field
    unit: str
    people: tuple[str, ...]
    local: dict[str, str] = field(default_factory=dict)

    def fmt(self, template: str) -> str:
        return template.format(pkg=self.pkg, item=self.item, items=self.items, field=self.field, other=self.other,
                               unit=self.unit, **self.local)  # fmt: skip


# name template, source template, argument maker (rng, records, names) -> args tuple.
# fmt: off
CORE_FUNCTIONS: list[tuple[str, str, object]] = [
    ("total_{field}", '''
def total_{field}({items}):
    {acc} = 0
    for {item} in {items}:
        {acc} += {item}["{field}"]
    return {acc}
''', lambda rng, recs, n: (recs,)),
    ("count_{items}_over", '''
def count_{items}_over({items}, {limit}):
    {count} = 0
    for {item} in {items}:
        if {item}["{field}"] > {limit}:
            {count} += 1
    return {count}
''', lambda rng, recs, n: (recs, rng.randint(2, 60))),
    ("find_{item}", '''
def find_{item}({items}, name):
    for {item} in {items}:
        if {item}["name"] == name:
            return {item}
    return None
''', lambda rng, recs, n: (recs, rng.choice([r["name"] for r in recs] + ["nobody"]))),
    ("average_{other}", '''
def average_{other}({items}):
    if not {items}:
        return 0.0
    {acc} = 0
    for {item} in {items}:
        {acc} += {item}["{other}"]
    return {acc} / len({items})
''', lambda rng, recs, n: (recs if rng.random() < 0.85 else [],)),
    ("{field}_spread", '''
def {field}_spread({items}):
    {value}s = [{item}["{field}"] for {item} in {items}]
    return max({value}s) - min({value}s)
''', lambda rng, recs, n: (recs,)),
    ("names_by_{other}", '''
def names_by_{other}({items}):
    ordered = sorted({items}, key=lambda {item}: {item}["{other}"])
    return [{item}["name"] for {item} in ordered]
''', lambda rng, recs, n: (recs,)),
    ("describe_{item}", '''
def describe_{item}({item}):
    return {item}["name"].title() + ": " + str({item}["{field}"]) + " {unit}"
''', lambda rng, recs, n: (rng.choice(recs),)),
    ("largest_{item}", '''
def largest_{item}({items}):
    {best} = None
    for {item} in {items}:
        if {best} is None or {item}["{field}"] > {best}["{field}"]:
            {best} = {item}
    return {best}
''', lambda rng, recs, n: (recs,)),
    ("{items}_between", '''
def {items}_between({items}, {low}, {high}):
    {out} = []
    for {item} in {items}:
        if {low} <= {item}["{other}"] <= {high}:
            {out}.append({item}["name"])
    return {out}
''', lambda rng, recs, n: (recs, *sorted((rng.randint(0, 40), rng.randint(10, 90))))),
    ("count_by_{other}", '''
def count_by_{other}({items}):
    {out} = {{}}
    for {item} in {items}:
        key = {item}["{other}"] % 3
        {out}[key] = {out}.get(key, 0) + 1
    return {out}
''', lambda rng, recs, n: (recs,)),
    ("clean_names", '''
def clean_names({items}):
    return [{item}["name"].strip().lower() for {item} in {items}]
''', lambda rng, recs, n: ([{**r, "name": rng.choice(["  ", "", " "]) + r["name"].upper() + rng.choice(["", " "])}
                             for r in recs],)),
]

UTIL_SOURCE = '''
def bounded({value}, {low}, {high}):
    if {value} < {low}:
        return {low}
    if {value} > {high}:
        return {high}
    return {value}


def ratio({part}, {whole}):
    if {whole} == 0:
        return 0.0
    return {part} / {whole}


def percent({part}, {whole}, digits=1):
    return round(100 * ratio({part}, {whole}), digits)
'''

REPORT_FUNCTIONS: list[tuple[str, str, object]] = [
    ("{field}_share", '''
def {field}_share({items}, name):
    {item} = find_{item}({items}, name)
    if {item} is None:
        return 0.0
    return percent({part}={item}["{field}"], {whole}=total_{field}({items}))
''', lambda rng, recs, n: (recs, rng.choice([r["name"] for r in recs] + ["nobody"]))),
    ("capped_{field}", '''
def capped_{field}({items}, {limit}):
    return [bounded({value}={item}["{field}"], {low}=0, {high}={limit}) for {item} in {items}]
''', lambda rng, recs, n: (recs, rng.randint(5, 50))),
    ("{other}_ratio", '''
def {other}_ratio({items}, name):
    {item} = find_{item}({items}, name)
    if {item} is None:
        return 0.0
    return ratio({part}={item}["{other}"], {whole}={item}["{field}"])
''', lambda rng, recs, n: (recs, rng.choice([r["name"] for r in recs]))),
]
# fmt: on
REPORT_NEEDS = ("find_{item}", "total_{field}")  # core functions report.py calls


@dataclass
class Project:
    theme: str
    level: int
    names: Names
    files: dict[str, str]  # path -> content, package and tests
    functions: dict[str, str]  # function name -> module path

    @property
    def split(self) -> str:
        return split_of_theme(self.theme)


def make_project(theme: str, level: int, rng: random.Random) -> Project:
    pkg, item, items, fields, unit, people = theme_spec(theme)
    f, o = fields if rng.random() < 0.5 else fields[::-1]
    names = Names(pkg, item, items, f, o, unit, people, {k: rng.choice(v) for k, v in SYNONYMS.items()})
    if names.local["part"] == names.local["whole"]:
        names.local["whole"] = "whole"
    core_count = {1: 2, 2: rng.randint(4, 5), 3: 3}[level]
    if level == 3:
        wanted = [fn for fn in CORE_FUNCTIONS if fn[0] in REPORT_NEEDS]
        others = [fn for fn in CORE_FUNCTIONS if fn[0] not in REPORT_NEEDS]
        core = wanted + rng.sample(others, core_count - len(wanted))
    else:
        core = rng.sample(CORE_FUNCTIONS, core_count)
    modules: dict[str, list[tuple[str, str, object]]] = {"core": core}
    if level == 3:
        modules["report"] = rng.sample(REPORT_FUNCTIONS, 2)
    files: dict[str, str] = {f"{pkg}/__init__.py": ""}
    functions: dict[str, str] = {}
    namespace: dict[str, dict] = {}
    if level == 3:
        files[f"{pkg}/util.py"] = names.fmt(UTIL_SOURCE).lstrip().replace("\n\n\ndef", "\n\n\ndef")
        namespace["util"] = _exec(files[f"{pkg}/util.py"], {})
    for module, chosen in modules.items():
        header = ""
        if module == "report":
            core_names = ", ".join(names.fmt(n) for n in REPORT_NEEDS)
            header = f"from {pkg}.core import {core_names}\nfrom {pkg}.util import bounded, percent, ratio\n\n\n"
        body = "\n\n".join(names.fmt(src).strip("\n") + "\n" for _, src, _ in chosen)
        path = f"{pkg}/{module}.py"
        files[path] = header + body
        scope = {**namespace.get("util", {}), **namespace.get("core", {})} if module == "report" else {}
        namespace[module] = _exec(body, scope)
        for fn_name, _, _ in chosen:
            functions[names.fmt(fn_name)] = path
        files[f"tests/test_{module}.py"] = _tests(pkg, module, chosen, names, namespace[module], rng)
    files["pyproject.toml"] = (
        f'[project]\nname = "{pkg}"\nversion = "0.1.0"\n\n[tool.pytest.ini_options]\ntestpaths = ["tests"]\n'
    )
    return Project(theme, level, names, files, functions)


def _exec(source: str, scope: dict) -> dict:
    namespace = dict(scope)
    exec(compile(source, "<generated>", "exec"), namespace)  # our own generated code, not user input
    return namespace


def _records(rng: random.Random, names: Names) -> list[dict]:
    chosen = rng.sample(names.people, k=min(len(names.people), rng.randint(3, 4)))
    return [{"name": p, names.field: rng.randint(1, 60), names.other: rng.randint(1, 40)} for p in chosen]


def _tests(pkg: str, module: str, chosen, names: Names, scope: dict, rng: random.Random) -> str:
    fns = [names.fmt(n) for n, _, _ in chosen]
    lines = [f"from {pkg}.{module} import {', '.join(fns)}"]
    for fn, (_, _, make_args) in zip(fns, chosen, strict=True):
        lines += ["", "", f"def test_{fn}():"]
        seen: set[str] = set()
        for _ in range(8):
            args = make_args(rng, _records(rng, names), names)
            call = f"{fn}({', '.join(repr(a) for a in args)})"
            if call in seen:
                continue
            seen.add(call)
            lines.append(f"    assert {call} == {scope[fn](*args)!r}")
            if len(seen) == 3:
                break
    return "\n".join(lines) + "\n"
