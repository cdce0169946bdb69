"""What every tool shares and the model does not need: the device and precision choice, the command-line
config idiom, the user-error base class and provenance records; and make setup's installer.  Imports nothing from the
project."""
