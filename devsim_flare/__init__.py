"""The only code that knows NVFlare: the Collab server programs (`servers`), the leaf (`leaf`,
`leaf_calls`), the recipe and environments (`recipe`), the job command line (`cli`), and this
project inside NVFlare's own edge stack (`edge`).

May import `devsim`, `processors` and `nvflare`; never `jobs`.
"""

import warnings

from devsim_flare.launch.forked_process import route_simulator_workers
from devsim_flare.sim_polling import shorten_simulator_polls_by_default

# The job scripts take NVFlare's own --export / --export-dir convention on purpose (NVFlare's recipe module strips
# them from sys.argv at import); its warning that a script-defined flag might clash says nothing to our users.
# The variant for --export-dir without --export still shows: that directory is then unused.
warnings.filterwarnings(
    "ignore",
    message=r"NVFlare reserves '--export' and '--export-dir' .* that use these names\.$",
    category=UserWarning,
)
shorten_simulator_polls_by_default()
route_simulator_workers()
