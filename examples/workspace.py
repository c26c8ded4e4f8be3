# examples/workspace.py: a deep agent that plans, and writes and edits files in its workspace
from backchannel import ScriptedModel, create_deep_agent

model = ScriptedModel([   # or "anthropic:claude-sonnet-4-5", "openai:gpt-4o-mini", ...
    {"tool_calls": [{"name": "write_todos", "args": {"todos": [{"content": "take notes", "status": "in_progress"}]}}]},
    {"tool_calls": [{"name": "write_file", "args": {"file_path": "/notes.md", "content": "tea: green\n"}}]},
    {"tool_calls": [{"name": "edit_file", "args": {"file_path": "/notes.md", "old_string": "green",
                                                   "new_string": "oolong"}}]},
    "The notes are in /notes.md.",
])
agent = create_deep_agent(model, todos=True)
state = agent.invoke("Take notes on tea")
print(state["files"]["/notes.md"]["content"], state["todos"])   # tea: oolong  [{'content': 'take notes', ...}]
