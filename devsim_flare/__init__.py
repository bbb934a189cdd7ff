"""The only code that knows NVFlare: the Collab server programs (`servers`), the leaf (`leaf`,
`leaf_calls`), the recipe and environments (`recipe`), the job command line (`cli`), and this
project inside NVFlare's own edge stack (`edge`).

May import `devsim`, `processors` and `nvflare`; never `jobs`.
"""

from devsim_flare.sim_polling import shorten_simulator_polls_by_default

shorten_simulator_polls_by_default()
