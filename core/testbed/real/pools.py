"""The finite pools the real task draws from: facts the project lists itself, and the names,
places, jobs and shop goods its made-up sentences use.

Only facts with one answer that no dictionary or atlas disputes are listed (a country whose
capital is contested, an opposite with two common answers, a plural with two accepted spellings
are left out). A fact's other accepted spellings are its aliases; one-word answers only, so a
reply is checked by whole words.
"""

from __future__ import annotations

# --------------------------------------------------------------------------- facts
# Each fact: (key, question subject, answer, aliases). The key decides the fact's split, so the
# two directions of one pair (the day after Sunday, the day before Monday) share a key.

CAPITALS = {
    "France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid",
    "Portugal": "Lisbon", "Greece": "Athens", "Austria": "Vienna", "Belgium": "Brussels",
    "Denmark": "Copenhagen", "Norway": "Oslo", "Sweden": "Stockholm", "Finland": "Helsinki",
    "Iceland": "Reykjavik", "Ireland": "Dublin", "Poland": "Warsaw", "Hungary": "Budapest",
    "the Czech Republic": "Prague", "Russia": "Moscow", "Ukraine": "Kyiv", "Romania": "Bucharest",
    "Bulgaria": "Sofia", "Serbia": "Belgrade", "Croatia": "Zagreb", "Egypt": "Cairo",
    "Kenya": "Nairobi", "Morocco": "Rabat", "Ghana": "Accra", "Nigeria": "Abuja",
    "Japan": "Tokyo", "China": "Beijing", "South Korea": "Seoul", "Thailand": "Bangkok",
    "Vietnam": "Hanoi", "the Philippines": "Manila", "Iran": "Tehran", "Iraq": "Baghdad",
    "Afghanistan": "Kabul", "Pakistan": "Islamabad", "Saudi Arabia": "Riyadh", "Turkey": "Ankara",
    "Syria": "Damascus", "Lebanon": "Beirut", "Jordan": "Amman", "Cuba": "Havana",
    "Peru": "Lima", "Chile": "Santiago", "Colombia": "Bogota", "Venezuela": "Caracas",
    "Ecuador": "Quito", "Uruguay": "Montevideo", "Canada": "Ottawa", "Australia": "Canberra",
    "New Zealand": "Wellington", "Brazil": "Brasilia", "Nepal": "Kathmandu",
    "Bangladesh": "Dhaka", "Estonia": "Tallinn", "Latvia": "Riga", "Lithuania": "Vilnius",
    "Slovakia": "Bratislava", "Slovenia": "Ljubljana", "Albania": "Tirana", "Cyprus": "Nicosia",
    "Malta": "Valletta", "the United Kingdom": "London", "Tunisia": "Tunis",
    "Algeria": "Algiers", "Libya": "Tripoli", "Senegal": "Dakar",
    "Uganda": "Kampala", "Zimbabwe": "Harare", "Zambia": "Lusaka", "Angola": "Luanda",
    "Mali": "Bamako", "Qatar": "Doha", "Oman": "Muscat", "Belarus": "Minsk",
    "Armenia": "Yerevan", "Azerbaijan": "Baku", "Uzbekistan": "Tashkent",
    "North Korea": "Pyongyang", "Laos": "Vientiane", "Jamaica": "Kingston",
    "Nicaragua": "Managua", "Honduras": "Tegucigalpa", "Paraguay": "Asuncion", "Fiji": "Suva",
}  # fmt: skip
CAPITAL_ALIASES = {
    "Kyiv": ("Kiev",), "Tehran": ("Teheran",), "Bogota": ("Bogotá",), "Brasilia": ("Brasília",),
    "Asuncion": ("Asunción",), "Beijing": ("Peking",), "Reykjavik": ("Reykjavík",),
}  # fmt: skip

# one direction per pair; the answer's aliases after it
OPPOSITES = (
    ("hot", "cold"), ("big", "small", "little"), ("tall", "short"), ("up", "down"),
    ("day", "night"), ("black", "white"),
    ("open", "closed", "shut"), ("fast", "slow"), ("happy", "sad"), ("young", "old"),
    ("dark", "light"), ("early", "late"), ("good", "bad"), ("soft", "hard"), ("wet", "dry"),
    ("full", "empty"), ("rich", "poor"), ("top", "bottom"),
    ("first", "last"), ("push", "pull"), ("win", "lose"), ("love", "hate"),
    ("true", "false"), ("strong", "weak"), ("thick", "thin"), ("near", "far"),
    ("buy", "sell"), ("give", "take"), ("remember", "forget"), ("always", "never"),
    ("inside", "outside"), ("above", "below"), ("friend", "enemy"),
    ("clean", "dirty"), ("cheap", "expensive"), ("loud", "quiet"), ("heavy", "light"),
    ("narrow", "wide"), ("asleep", "awake"), ("north", "south"),
    ("east", "west"), ("summer", "winter"), ("boy", "girl"), ("king", "queen"),
    ("father", "mother"), ("brother", "sister"), ("husband", "wife"), ("son", "daughter"),
    ("uncle", "aunt"), ("entrance", "exit"), ("alive", "dead"), ("increase", "decrease"),
    ("maximum", "minimum"), ("ancient", "modern"), ("private", "public"),
    ("smooth", "rough"), ("deep", "shallow"), ("tight", "loose"), ("long", "short"),
    ("laugh", "cry"), ("easy", "difficult", "hard"), ("safe", "dangerous"),
    ("sunrise", "sunset"), ("arrive", "leave", "depart"), ("import", "export"),
)  # fmt: skip

# singular -> the plural; plurals that are not the singular plus "s" (the naive "+s" form is
# the wrong option a reply is told apart from)
PLURALS = {
    "child": "children", "mouse": "mice", "foot": "feet", "tooth": "teeth", "goose": "geese",
    "man": "men", "woman": "women", "ox": "oxen", "leaf": "leaves", "knife": "knives",
    "wife": "wives", "wolf": "wolves", "half": "halves", "life": "lives", "loaf": "loaves",
    "shelf": "shelves", "thief": "thieves", "calf": "calves", "baby": "babies",
    "city": "cities", "party": "parties", "lady": "ladies", "story": "stories",
    "cherry": "cherries", "box": "boxes", "fox": "foxes", "church": "churches",
    "dish": "dishes", "glass": "glasses", "watch": "watches", "brush": "brushes",
    "dress": "dresses", "potato": "potatoes", "tomato": "tomatoes", "hero": "heroes",
    "bench": "benches", "class": "classes", "wish": "wishes", "lunch": "lunches",
    "berry": "berries", "puppy": "puppies", "fly": "flies", "spy": "spies", "army": "armies",
    "country": "countries", "family": "families", "body": "bodies", "lily": "lilies",
    "beach": "beaches", "peach": "peaches", "match": "matches", "kiss": "kisses",
}  # fmt: skip

COLOUR_WORDS = (
    "red", "orange", "yellow", "green", "blue", "purple", "violet", "pink", "brown", "black",
    "white", "grey", "gray",
)  # fmt: skip
# thing (as the question names it) -> its colour
COLOURS = {
    "grass": "green", "snow": "white", "coal": "black", "a ripe banana": "yellow",
    "blood": "red", "a lemon": "yellow", "a carrot": "orange", "milk": "white",
    "a ripe strawberry": "red", "a pumpkin": "orange", "an emerald": "green", "a ruby": "red",
    "a crow": "black", "a flamingo": "pink", "a ripe tomato": "red", "charcoal": "black",
    "an eggplant": "purple", "a lime": "green", "a ripe cherry": "red", "a raven": "black",
    "soot": "black", "tar": "black", "an elephant": "grey", "a pea": "green",
    "broccoli": "green", "a cucumber": "green", "chalk": "white", "a canary": "yellow",
    "a blueberry": "blue", "the sky on a clear day": "blue", "a polar bear": "white",
}  # fmt: skip
COLOUR_ALIASES = {"grey": ("gray",)}

DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
MONTHS = (
    "January", "February", "March", "April", "May", "June", "July", "August", "September",
    "October", "November", "December",
)  # fmt: skip

# animal -> its sound, then other words for it (each as a reply may inflect it)
SOUNDS = {
    "cow": ("moo", "moos", "mooing"),
    "dog": ("bark", "barks", "barking", "woof"),
    "cat": ("meow", "meows", "miaow", "mew", "purr", "purrs"),
    "sheep": ("baa", "bleat", "bleats"),
    "duck": ("quack", "quacks"),
    "pig": ("oink", "oinks", "grunt", "grunts"),
    "horse": ("neigh", "neighs", "whinny"),
    "lion": ("roar", "roars"),
    "owl": ("hoot", "hoots"),
    "snake": ("hiss", "hisses"),
    "bee": ("buzz", "buzzes", "buzzing"),
    "frog": ("croak", "croaks", "ribbit"),
    "mouse": ("squeak", "squeaks"),
    "donkey": ("bray", "brays", "hee-haw"),
    "wolf": ("howl", "howls"),
    "hen": ("cluck", "clucks"),
    "turkey": ("gobble", "gobbles"),
    "crow": ("caw", "caws"),
    "dove": ("coo", "coos"),
}

# --------------------------------------------------------------------------- made-up sentences

NAMES = {  # name -> subject pronoun
    "Tom": "he", "Mia": "she", "Sam": "he", "Ana": "she", "Ben": "he", "Lily": "she",
    "Max": "he", "Zoe": "she", "Leo": "he", "Emma": "she", "Noah": "he", "Ava": "she",
    "Omar": "he", "Nina": "she", "Ivan": "he", "Sara": "she", "Raj": "he", "Yuki": "she",
    "Carlos": "he", "Grace": "she", "Hugo": "he", "Clara": "she", "Felix": "he", "Ella": "she",
    "Oscar": "he", "Ruby": "she", "Jack": "he", "Alice": "she", "David": "he", "Maria": "she",
    "Peter": "he", "Laura": "she", "Adam": "he", "Julia": "she", "Paul": "he", "Eva": "she",
    "Mark": "he", "Hana": "she", "Luis": "he", "Olga": "she", "Karl": "he", "Rosa": "she",
    "Ali": "he", "Lena": "she", "Tariq": "he", "Mina": "she", "Erik": "he", "Ingrid": "she",
    "Pablo": "he", "Sonia": "she", "Kenji": "he", "Amara": "she", "Victor": "he",
    "Helen": "she", "Simon": "he", "Diana": "she", "Arthur": "he", "Nora": "she",
    "Henry": "he", "Iris": "she",
}  # fmt: skip
CITIES = (
    "Lyon", "Milan", "Munich", "Hamburg", "Porto", "Seville", "Naples", "Geneva", "Zurich",
    "Krakow", "Boston", "Chicago", "Denver", "Seattle", "Dallas", "Houston", "Toronto",
    "Montreal", "Sydney", "Melbourne", "Osaka", "Kyoto", "Mumbai", "Shanghai", "Barcelona",
    "Valencia", "Marseille", "Glasgow", "Manchester", "Liverpool", "Leeds", "Bristol",
    "Cologne", "Frankfurt", "Turin", "Venice", "Florence", "Bergen", "Gothenburg", "Antwerp",
)  # fmt: skip
JOBS = (
    "baker", "teacher", "doctor", "farmer", "pilot", "nurse", "painter", "driver", "chef",
    "dentist", "lawyer", "plumber", "singer", "writer", "tailor", "builder", "gardener",
    "fisherman", "librarian", "carpenter", "banker", "waiter", "soldier", "dancer",
)  # fmt: skip
# plural nouns: objects of the word problems, the JSON sentences and the shop's goods
GOODS = (
    "apples", "bananas", "oranges", "pears", "plums", "lemons", "peaches", "cherries",
    "grapes", "melons", "carrots", "potatoes", "onions", "tomatoes", "cucumbers", "peppers",
    "eggs", "cookies", "muffins", "candies", "cakes", "pies", "donuts", "rolls", "bagels",
    "pencils", "pens", "markers", "crayons", "erasers", "rulers", "notebooks", "books",
    "folders", "envelopes", "stamps", "stickers", "cards", "postcards", "maps", "marbles",
    "balloons", "kites", "balls", "dolls", "puzzles", "blocks", "buttons", "beads",
    "ribbons", "candles", "cups", "mugs", "plates", "bowls", "spoons", "forks", "knives",
    "napkins", "towels", "socks", "gloves", "hats", "scarves", "shirts", "belts", "shoes",
    "boots", "umbrellas", "bags", "baskets", "boxes", "jars", "bottles", "batteries",
    "bulbs", "lamps", "clocks", "watches", "rings", "keys", "locks", "nails", "screws",
    "hammers", "brushes", "paints", "bricks", "tiles", "ropes", "chairs", "tables", "pillows",
    "blankets", "sponges", "soaps", "combs", "mirrors", "magnets", "whistles", "flags",
    "drums", "flutes", "bells", "seeds", "flowers", "roses", "tulips", "plants", "pots",
    "shovels", "buckets", "tents", "tickets", "coins", "shells", "rocks", "feathers",
    "kiwis", "mangoes", "apricots", "figs", "walnuts", "almonds", "peanuts", "pretzels",
    "crackers", "sandwiches", "pizzas", "waffles", "pancakes", "lollipops", "cupcakes",
    "biscuits", "radishes", "beets", "turnips", "pumpkins", "coconuts", "pineapples",
    "avocados", "chestnuts", "oysters", "sausages", "noodles", "jackets", "sweaters", "coats",
    "skirts", "trousers", "sandals", "slippers", "helmets", "wallets", "purses", "backpacks",
    "suitcases", "glasses", "necklaces", "bracelets", "earrings", "brooches", "badges",
    "trophies", "medals", "posters", "frames", "calendars", "diaries", "journals", "comics",
    "magazines", "newspapers", "pamphlets", "crayon boxes", "paintbrushes", "easels",
    "canvases", "scissors", "staplers", "clips", "pins", "needles", "threads", "yarns",
    "kettles", "teapots", "saucers", "jugs", "pans", "ladles", "whisks", "sieves", "trays",
    "vases", "rugs", "curtains", "cushions", "hammocks", "ladders", "wheelbarrows", "rakes",
    "hoses", "sprinklers", "lanterns", "torches", "compasses", "binoculars", "telescopes",
    "globes", "dice", "chess sets", "yo-yos", "robots", "trains", "trucks", "boats",
)  # fmt: skip
