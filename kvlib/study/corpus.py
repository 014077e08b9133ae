"""The corpus the tiny model learns from: countries and capitals, in English and Chinese.

A table of facts is rendered through question/answer templates; some templates are held out
(never trained on) so that notebooks 02 and 06 can measure generalisation and held-out loss.
Everything is generated here, deterministically, so the repo needs no download. Left out on
purpose: any other kind of fact, and facts whose capital is disputed or shared (e.g. Bolivia).
"""

from __future__ import annotations

import bisect
import random
import re
from dataclasses import dataclass
from typing import Literal

Lang = Literal["en", "zh"]
Split = Literal["train", "held_out"]

# The two prompts the course is built around, with the answer greedy decoding must produce.
ANCHORS: tuple[tuple[str, str], ...] = (
    ("法国的首都是", "巴黎"),
    ("Q: What is the capital of France?\nA:", " Paris"),
)


# ---------------------------------------------------------------------------------------------
# The facts


@dataclass(frozen=True)
class Country:
    name_en: str  # as it reads mid-sentence: "the Netherlands", "France"
    capital_en: str  # ASCII spelling ("Bogota"), to keep the vocabulary small
    name_zh: str
    capital_zh: str


_FACTS = """
France|Paris|法国|巴黎
Germany|Berlin|德国|柏林
the United Kingdom|London|英国|伦敦
Italy|Rome|意大利|罗马
Spain|Madrid|西班牙|马德里
Portugal|Lisbon|葡萄牙|里斯本
Russia|Moscow|俄罗斯|莫斯科
the Netherlands|Amsterdam|荷兰|阿姆斯特丹
Belgium|Brussels|比利时|布鲁塞尔
Switzerland|Bern|瑞士|伯尔尼
Austria|Vienna|奥地利|维也纳
Poland|Warsaw|波兰|华沙
the Czech Republic|Prague|捷克|布拉格
Hungary|Budapest|匈牙利|布达佩斯
Romania|Bucharest|罗马尼亚|布加勒斯特
Bulgaria|Sofia|保加利亚|索非亚
Serbia|Belgrade|塞尔维亚|贝尔格莱德
Croatia|Zagreb|克罗地亚|萨格勒布
Slovenia|Ljubljana|斯洛文尼亚|卢布尔雅那
Slovakia|Bratislava|斯洛伐克|布拉迪斯拉发
Ukraine|Kyiv|乌克兰|基辅
Belarus|Minsk|白俄罗斯|明斯克
Lithuania|Vilnius|立陶宛|维尔纽斯
Latvia|Riga|拉脱维亚|里加
Estonia|Tallinn|爱沙尼亚|塔林
Finland|Helsinki|芬兰|赫尔辛基
Sweden|Stockholm|瑞典|斯德哥尔摩
Norway|Oslo|挪威|奥斯陆
Denmark|Copenhagen|丹麦|哥本哈根
Iceland|Reykjavik|冰岛|雷克雅未克
Ireland|Dublin|爱尔兰|都柏林
Greece|Athens|希腊|雅典
Albania|Tirana|阿尔巴尼亚|地拉那
North Macedonia|Skopje|北马其顿|斯科普里
Montenegro|Podgorica|黑山|波德戈里察
Moldova|Chisinau|摩尔多瓦|基希讷乌
Cyprus|Nicosia|塞浦路斯|尼科西亚
Malta|Valletta|马耳他|瓦莱塔
China|Beijing|中国|北京
Japan|Tokyo|日本|东京
South Korea|Seoul|韩国|首尔
North Korea|Pyongyang|朝鲜|平壤
Mongolia|Ulaanbaatar|蒙古国|乌兰巴托
India|New Delhi|印度|新德里
Pakistan|Islamabad|巴基斯坦|伊斯兰堡
Bangladesh|Dhaka|孟加拉国|达卡
Nepal|Kathmandu|尼泊尔|加德满都
Bhutan|Thimphu|不丹|廷布
Thailand|Bangkok|泰国|曼谷
Vietnam|Hanoi|越南|河内
Laos|Vientiane|老挝|万象
Cambodia|Phnom Penh|柬埔寨|金边
Myanmar|Naypyidaw|缅甸|内比都
Malaysia|Kuala Lumpur|马来西亚|吉隆坡
Indonesia|Jakarta|印度尼西亚|雅加达
the Philippines|Manila|菲律宾|马尼拉
Afghanistan|Kabul|阿富汗|喀布尔
Iran|Tehran|伊朗|德黑兰
Iraq|Baghdad|伊拉克|巴格达
Syria|Damascus|叙利亚|大马士革
Jordan|Amman|约旦|安曼
Lebanon|Beirut|黎巴嫩|贝鲁特
Saudi Arabia|Riyadh|沙特阿拉伯|利雅得
Qatar|Doha|卡塔尔|多哈
the United Arab Emirates|Abu Dhabi|阿联酋|阿布扎比
Oman|Muscat|阿曼|马斯喀特
Yemen|Sanaa|也门|萨那
Bahrain|Manama|巴林|麦纳麦
Turkey|Ankara|土耳其|安卡拉
Georgia|Tbilisi|格鲁吉亚|第比利斯
Armenia|Yerevan|亚美尼亚|埃里温
Azerbaijan|Baku|阿塞拜疆|巴库
Kazakhstan|Astana|哈萨克斯坦|阿斯塔纳
Uzbekistan|Tashkent|乌兹别克斯坦|塔什干
Kyrgyzstan|Bishkek|吉尔吉斯斯坦|比什凯克
Tajikistan|Dushanbe|塔吉克斯坦|杜尚别
Turkmenistan|Ashgabat|土库曼斯坦|阿什哈巴德
Egypt|Cairo|埃及|开罗
Libya|Tripoli|利比亚|的黎波里
Algeria|Algiers|阿尔及利亚|阿尔及尔
Morocco|Rabat|摩洛哥|拉巴特
Sudan|Khartoum|苏丹|喀土穆
Ethiopia|Addis Ababa|埃塞俄比亚|亚的斯亚贝巴
Kenya|Nairobi|肯尼亚|内罗毕
Uganda|Kampala|乌干达|坎帕拉
Rwanda|Kigali|卢旺达|基加利
Tanzania|Dodoma|坦桑尼亚|多多马
Nigeria|Abuja|尼日利亚|阿布贾
Ghana|Accra|加纳|阿克拉
Senegal|Dakar|塞内加尔|达喀尔
Mali|Bamako|马里|巴马科
Niger|Niamey|尼日尔|尼亚美
Cameroon|Yaounde|喀麦隆|雅温得
Angola|Luanda|安哥拉|罗安达
Zambia|Lusaka|赞比亚|卢萨卡
Zimbabwe|Harare|津巴布韦|哈拉雷
Mozambique|Maputo|莫桑比克|马普托
Madagascar|Antananarivo|马达加斯加|塔那那利佛
Somalia|Mogadishu|索马里|摩加迪沙
Namibia|Windhoek|纳米比亚|温得和克
Botswana|Gaborone|博茨瓦纳|哈博罗内
Malawi|Lilongwe|马拉维|利隆圭
Chad|N'Djamena|乍得|恩贾梅纳
Gabon|Libreville|加蓬|利伯维尔
Guinea|Conakry|几内亚|科纳克里
Liberia|Monrovia|利比里亚|蒙罗维亚
Sierra Leone|Freetown|塞拉利昂|弗里敦
Togo|Lome|多哥|洛美
Mauritania|Nouakchott|毛里塔尼亚|努瓦克肖特
Eritrea|Asmara|厄立特里亚|阿斯马拉
Burkina Faso|Ouagadougou|布基纳法索|瓦加杜古
the United States|Washington|美国|华盛顿
Canada|Ottawa|加拿大|渥太华
Mexico|Mexico City|墨西哥|墨西哥城
Cuba|Havana|古巴|哈瓦那
Jamaica|Kingston|牙买加|金斯敦
Haiti|Port-au-Prince|海地|太子港
the Dominican Republic|Santo Domingo|多米尼加|圣多明各
Guatemala|Guatemala City|危地马拉|危地马拉城
Honduras|Tegucigalpa|洪都拉斯|特古西加尔巴
El Salvador|San Salvador|萨尔瓦多|圣萨尔瓦多
Nicaragua|Managua|尼加拉瓜|马那瓜
Costa Rica|San Jose|哥斯达黎加|圣何塞
Panama|Panama City|巴拿马|巴拿马城
Colombia|Bogota|哥伦比亚|波哥大
Venezuela|Caracas|委内瑞拉|加拉加斯
Ecuador|Quito|厄瓜多尔|基多
Peru|Lima|秘鲁|利马
Brazil|Brasilia|巴西|巴西利亚
Chile|Santiago|智利|圣地亚哥
Argentina|Buenos Aires|阿根廷|布宜诺斯艾利斯
Uruguay|Montevideo|乌拉圭|蒙得维的亚
Paraguay|Asuncion|巴拉圭|亚松森
Australia|Canberra|澳大利亚|堪培拉
New Zealand|Wellington|新西兰|惠灵顿
Papua New Guinea|Port Moresby|巴布亚新几内亚|莫尔兹比港
Fiji|Suva|斐济|苏瓦
"""

COUNTRIES: tuple[Country, ...] = tuple(Country(*line.split("|")) for line in _FACTS.strip().splitlines())


# ---------------------------------------------------------------------------------------------
# The templates
#
# Placeholders: {country}, {capital}; English also {Country} (sentence start) and {countrys} /
# {Countrys} (possessive). A template is evaluated when {country} comes before {capital}: its
# prompt is the text before {capital}, its answer the capital (with the space before it, in
# English). Templates that name the capital first ("{capital} is the capital of ...") are
# training text only: they teach the fact in the other direction.
#
# Templates are composed from parts, so that the model meets the same fact in many contexts and
# must learn to look the country up wherever it stands: a question inside a dialogue frame
# (asker, answerer, ending), a statement after a lead-in, or a fixed form. Each part list has a
# held-out tail: a held-out template uses at least one part the training text never contains.


@dataclass(frozen=True)
class Template:
    lang: Lang
    text: str
    held_out: bool  # True: never in the training text; used to measure generalisation


@dataclass(frozen=True)
class _Parts:
    """The parts of one language; each tuple is (training parts, held-out parts)."""

    questions: tuple[list[str], list[str]]
    frames: tuple[list[tuple[str, str, str]], list[tuple[str, str, str]]]  # (asker, answerer, ending)
    statements: tuple[list[str], list[str]]
    leads: tuple[list[str], list[str]]
    forms: tuple[list[str], list[str]]


def _dialogue(askers: list[str], answerers: list[str], colon: str, ending: str) -> list[tuple[str, str, str]]:
    """Frames "Alice: <question>\\nBob: <capital>.": with many speakers, the model cannot key the
    answer on one label; it must learn that the line after a question answers it."""
    return [(a + colon, "\n" + b + colon, ending) for a, b in zip(askers, answerers)]


_EN = _Parts(
    questions=(
        [
            "What is the capital of {country}?",
            "What is the capital city of {country}?",
            "Which city is the capital of {country}?",
            "What city is the capital of {country}?",
            "Name the capital of {country}.",
            "Tell me the capital of {country}.",
            "Do you know the capital of {country}?",
            "What is {countrys} capital?",
            "The capital of {country}?",
        ],
        ["Which city serves as the capital of {country}?", "Can you tell me what the capital of {country} is?"],
    ),
    frames=(
        [
            ("Q: ", "\nA: ", ""),
            ("Question: ", "\nAnswer: ", ""),
            ("Quiz: ", "\nAnswer: ", "."),
            ("User: ", "\nAssistant: ", "."),
            ("Interviewer: ", "\nGuest: ", "."),
            ("", " The answer is ", "."),
            ("", " It is ", "."),
        ]
        + _dialogue(["Alice", "Tom", "Anna", "Mia", "Sam"], ["Bob", "Mary", "Ben", "Leo", "Kate"], ": ", "."),
        [("Teacher: ", "\nStudent: ", "")],
    ),
    statements=(
        [
            "The capital of {country} is {capital}.",
            "The capital city of {country} is {capital}.",
            "{Countrys} capital is {capital}.",
            "{Countrys} capital city is {capital}.",
            "In {country}, the capital is {capital}.",
            "{Country} has its capital in {capital}.",
            "{Country} is a country whose capital is {capital}.",
            "The seat of government of {country} is {capital}.",
            "The government of {country} sits in {capital}.",
            "{Country} is governed from {capital}.",
            "If you travel to the capital of {country}, you arrive in {capital}.",
        ],
        ["{Countrys} seat of government is {capital}.", "The city that is the capital of {country} is {capital}."],
    ),
    leads=(
        ["", "Fact: ", "Everyone knows that ", "As we all know, ", "In geography class we learned that "],
        ["Trivia: "],
    ),
    forms=(
        [
            "Country: {country}\nCapital: {capital}",
            "Capital of {country}: {capital}",
            "{Country}: capital {capital}.",
            "Input: {country}\nOutput: {capital}",
            "{capital} is the capital of {country}.",
            "{capital} is the capital city of {country}.",
            "No other city but {capital} is the capital of {country}.",
            "Q: {capital} is the capital of which country?\nA: {Country}",
        ],
        ["Capital city of {country}: {capital}"],
    ),
)

_ZH = _Parts(
    questions=(
        [
            "{country}的首都是哪里？",
            "{country}的首都是哪座城市？",
            "{country}的首都是什么？",
            "{country}的首都是什么城市？",
            "哪座城市是{country}的首都？",
            "{country}的首都在哪里？",
            "{country}的首都叫什么？",
            "你知道{country}的首都吗？",
            "请告诉我{country}的首都。",
        ],
        ["{country}的首都是哪一座城市？", "{country}的首都叫什么名字？"],
    ),
    frames=(
        [
            ("问：", "\n答：", ""),
            ("问题：", "\n回答：", ""),
            ("考考你：", "答案是", "。"),
            ("用户：", "\n助手：", ""),
            ("甲：", "\n乙：", "。"),
            ("小测验：", "\n答案：", ""),
            ("猜一猜，", "是", "。"),
        ]
        + _dialogue(["小明", "张三", "王芳", "小王", "大卫"], ["小红", "李四", "李华", "小李", "安娜"], "：", "。"),
        [("老师：", "\n学生：", "")],
    ),
    statements=(
        [
            "{country}的首都是{capital}。",
            "{country}的首都叫{capital}。",
            "{country}的首都名叫{capital}。",
            "{country}的首都名为{capital}。",
            "{country}的首都的名字是{capital}。",
            "{country}的首都城市是{capital}。",
            "{country}的首都设在{capital}。",
            "{country}把首都设在{capital}。",
            "{country}以{capital}为首都。",
            "{country}的政府设在首都{capital}。",
            "{country}这个国家的首都是{capital}。",
            "说到{country}的首都，那就是{capital}。",
            "如果你去{country}的首都，你会到达{capital}。",
            "{country}的首都不是别的城市，而是{capital}。",
            "{country}是一个国家，它的首都是{capital}。",
        ],
        ["{country}的首都，就是{capital}。", "关于{country}，它的首都是{capital}。"],
    ),
    leads=(["", "事实：", "大家都知道，", "众所周知，", "学生都知道，", "地理课上老师说，"], ["你知道吗？"]),
    forms=(
        [
            "{country}首都：{capital}",
            "国家：{country}\n首都：{capital}",
            "【{country}】首都：{capital}",
            "输入：{country}\n输出：{capital}",
            "关于{country}：首都是{capital}。",
            "{capital}是{country}的首都。",
            "{capital}是哪个国家的首都？是{country}。",
            "问：{capital}是哪国的首都？\n答：{country}",
        ],
        ["国家名：{country}\n首都名：{capital}"],
    ),
)


def _after_lead(lead: str, statement: str) -> str:
    """The statement as it reads after a lead-in: mid-sentence after "Everyone knows that "."""
    if not lead or lead.endswith((": ", "：", "？")):
        return statement
    statement = statement.replace("{Country", "{country")
    return statement[0].lower() + statement[1:]


def _compose(lang: Lang, parts: _Parts) -> list[Template]:
    """Every combination of parts; held out when it uses any held-out part."""
    out = []
    (q_train, q_held), (f_train, f_held) = parts.questions, parts.frames
    for i, question in enumerate(q_train + q_held):
        for j, (asker, answerer, ending) in enumerate(f_train + f_held):
            held = i >= len(q_train) or j >= len(f_train)
            out.append(Template(lang, asker + question + answerer + "{capital}" + ending, held))
    (s_train, s_held), (l_train, l_held) = parts.statements, parts.leads
    for i, statement in enumerate(s_train + s_held):
        for j, lead in enumerate(l_train + l_held):
            held = i >= len(s_train) or j >= len(l_train)
            out.append(Template(lang, lead + _after_lead(lead, statement), held))
    out += [Template(lang, form, False) for form in parts.forms[0]]
    out += [Template(lang, form, True) for form in parts.forms[1]]
    return out


TEMPLATES: tuple[Template, ...] = tuple(_compose("en", _EN) + _compose("zh", _ZH))


# ---------------------------------------------------------------------------------------------
# Rendering


def _fields(template: Template, country: Country) -> dict[str, str]:
    if template.lang == "zh":
        return {"country": country.name_zh, "capital": country.capital_zh}
    name = country.name_en
    upper = name[0].upper() + name[1:]  # "the Netherlands" -> "The Netherlands"
    ending = "'" if name.endswith("s") else "'s"  # "the Philippines'", "France's"
    return {
        "country": name,
        "Country": upper,
        "countrys": name + ending,
        "Countrys": upper + ending,
        "capital": country.capital_en,
    }


def render(template: Template, country: Country) -> str:
    """One record: the template filled in with one country.

    Example: render(Template("en", "The capital of {country} is {capital}.", False), France)
             -> "The capital of France is Paris."
    """
    return template.text.format(**_fields(template, country))


def split_prompt(template: Template, country: Country) -> tuple[str, str] | None:
    """(prompt, answer) for a template that asks for the capital; None if it names the capital first.

    The prompt is the record up to the capital; a space before the capital belongs to the answer,
    as the tokenizer sees it: ("Q: What is the capital of France?\\nA:", " Paris").
    """
    head = template.text.split("{capital}")[0]
    if not re.search(r"\{[Cc]ountrys?\}", head):
        return None
    prompt = head.format(**_fields(template, country))
    answer = _fields(template, country)["capital"]
    if prompt.endswith(" "):
        prompt, answer = prompt[:-1], " " + answer
    return prompt, answer


def templates(split: Split, lang: Lang | None = None) -> list[Template]:
    """The templates of one split ("train" or "held_out"), optionally of one language."""
    if split not in ("train", "held_out"):
        raise ValueError(f"split must be 'train' or 'held_out', got {split!r}")
    if lang not in (None, "en", "zh"):
        raise ValueError(f"lang must be 'en', 'zh' or None, got {lang!r}")
    return [t for t in TEMPLATES if t.held_out == (split == "held_out") and lang in (None, t.lang)]


def records(split: Split) -> list[str]:
    """Every template of the split filled in with every country, in table order."""
    return [render(t, c) for t in templates(split) for c in COUNTRIES]


def shuffled_records(split: Split, seed: int = 0) -> list[str]:
    """The records of a split in a seeded random order (a fair mix from the first record on)."""
    out = records(split)
    random.Random(seed).shuffle(out)
    return out


def text(split: Split, seed: int = 0) -> str:
    """The records of a split, shuffled with `seed`, one per line ("\\n" after each).

    Q/A records span two lines; a record always starts a line.
    """
    return "".join(r + "\n" for r in shuffled_records(split, seed))


def train_text(seed: int = 0) -> str:
    """The training text: every training template for every country, shuffled."""
    return text("train", seed)


def held_out_text(seed: int = 0) -> str:
    """Text in the held-out phrasings (same facts, templates never trained on)."""
    return text("held_out", seed)


@dataclass(frozen=True)
class EvalPrompt:
    prompt: str
    answer: str  # what greedy decoding must produce next, e.g. " Paris" or "巴黎"
    lang: Lang
    split: Split
    template: str
    country: str  # English name, to read results


def eval_prompts(split: Split, lang: Lang | None = None, stride: int = 1) -> list[EvalPrompt]:
    """The capital questions of a split: one prompt per (template, country), with its answer.

    stride > 1 keeps template i with country j only when (i + j) % stride == 0: every template is
    still asked, about every stride-th country, and every country through every stride-th template.
    Example: eval_prompts("train", "en")[0]
             -> EvalPrompt(prompt="Q: What is the capital of France?\\nA:", answer=" Paris", ...)
    """
    if not (isinstance(stride, int) and stride >= 1):
        raise ValueError(f"stride must be a positive int, got {stride!r}")
    out = []
    for i, t in enumerate(templates(split, lang)):
        for j, c in enumerate(COUNTRIES):
            pair = split_prompt(t, c) if (i + j) % stride == 0 else None
            if pair is not None:
                out.append(EvalPrompt(pair[0], pair[1], t.lang, split, t.text, c.name_en))
    return out


def conflicts() -> list[tuple[str, str, str]]:
    """(prompt, answer, record) wherever a training record starts with an evaluation prompt but
    goes on differently. Must stay empty: "法国的首都是哪里？" in the training text would teach
    the model to continue "法国的首都是" with 哪, not 巴."""
    starts = sorted(records("train"))
    found = []
    for split in ("train", "held_out"):
        for it in eval_prompts(split):
            i = bisect.bisect_left(starts, it.prompt)
            while i < len(starts) and starts[i].startswith(it.prompt):
                if not starts[i][len(it.prompt) :].startswith(it.answer):
                    found.append((it.prompt, it.answer, starts[i]))
                i += 1
    return found
