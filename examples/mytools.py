# examples/mytools.py: tools for the chat, named in config.toml as mytools:search and mytools:send_email
from backchannel import tool

NOTES = {"tea": "Tea was first drunk in China, about 2700 BC.", "coffee": "Coffee was first brewed in Yemen."}


@tool
def search(query: str) -> str:
    """Search the notes.

    Args:
        query: What to look for.
    """
    return " ".join(fact for subject, fact in NOTES.items() if subject in query.lower()) or "Nothing found."


@tool
def send_email(to: str, subject: str, body: str) -> str:
    """Send an email (this one only prints it).

    Args:
        to: The recipient's address.
        subject: The subject line.
        body: The text.
    """
    print(f"To: {to}\nSubject: {subject}\n\n{body}")
    return f"sent to {to}"
