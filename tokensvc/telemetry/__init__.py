"""What the service tells its operators: the logs, the metrics, and the redaction of secrets
from both. Importing the package loads none of them: the protocol layer takes the logs alone."""
