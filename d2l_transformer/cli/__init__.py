"""The command line, ``d2l-transformer`` (`commands`): its parser (`parser`) and its error policy
(`guard`)."""

from .commands import get_parser, main
from .guard import EXIT_BAD_INPUT, EXIT_BUG, EXIT_ERROR
