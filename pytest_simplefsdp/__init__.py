"""pytest-simplefsdp: the SimpleFSDP composability matrix of torchtitan as a pytest plugin.

Nothing is imported here: every pytest run in an environment with the plugin installed imports this
package (the ``pytest11`` entry point), and ranks import its ``shim`` subpackage at start-up."""

__version__ = "0.2.0"
