"""response_format: the answer as an object of a schema, in the final state's ``structured_response``."""

import pytest
from pydantic import BaseModel
from subagent_helpers import call

from backchannel import ScriptedModel
from backchannel.deep_agent import create_deep_agent
from backchannel.runtime import LocalRuntime


class Weather(BaseModel):
    """The weather in a city."""

    city: str
    celsius: float


async def test_a_pydantic_schema_ends_the_run_with_an_instance_after_invalid_arguments_are_fixed():
    model = ScriptedModel([
        {"tool_calls": [call("Weather", {"city": "Oslo", "celsius": "cold"}, "bad")]},
        {"tool_calls": [call("Weather", {"city": "Oslo", "celsius": -3.5}, "good")]},
        "never asked"])
    model.record = True
    agent = create_deep_agent(model, response_format=Weather, general_purpose=False)
    state = await agent.ainvoke("weather in Oslo?")
    assert state["structured_response"] == Weather(city="Oslo", celsius=-3.5)
    bad, good = [m for m in state["messages"] if m.type == "tool"]
    assert bad.status == "error" and "celsius" in bad.text
    assert good.text == "Returning structured response: Weather(city='Oslo', celsius=-3.5)"
    assert model.calls == 2  # the schema's tool ended the run
    request = model.requests[0]
    assert request.settings["tool_choice"] == "required"
    [schema_tool] = [t for t in request.tools if t.name == "Weather"]
    assert schema_tool.parameters["required"] == ["city", "celsius"]
    assert schema_tool.description.startswith("The weather in a city.")


async def test_a_json_schema_gives_a_dict_and_it_is_in_the_threads_state():
    schema = {"title": "Verdict", "description": "A yes or no answer.", "type": "object",
              "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}}, "required": ["answer"]}
    model = ScriptedModel([{"tool_calls": [call("Verdict", {}, "missing")]},
                           {"tool_calls": [call("Verdict", {"answer": "yes"}, "ok")]}])
    agent = create_deep_agent(model, response_format=schema, general_purpose=False)
    async with LocalRuntime("memory", agents={"judge": agent}) as rt:
        thread = (await rt.threads.create())["thread_id"]
        await rt.runs.wait(thread, "judge", input="is it?")
        values = (await rt.threads.get_state(thread))["values"]
    assert values["structured_response"] == {"answer": "yes"}
    assert "missing required argument(s): answer" in values["messages"][2]["content"]


def test_other_response_formats_are_refused():
    with pytest.raises(TypeError, match="pydantic model class or a JSON schema"):
        create_deep_agent(ScriptedModel([]), response_format=str)
