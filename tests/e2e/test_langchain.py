"""langchain-openai (pinned in requirements.txt) against quire with the
bundled model: with_structured_output(method="function_calling") and
bind_tools give parsed results, and a plain invoke a message (issue 26)."""
import pytest
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

from test_serve_openai import Server


class Person(BaseModel):
    """A person in the story."""
    name: str = Field(max_length=20, description="the person's name")
    age: int = Field(ge=0, le=120)


class GetWeather(BaseModel):
    """Get the current weather in a city."""
    city: str = Field(max_length=20)


@pytest.fixture(scope="module")
def llm(quire):
    s = Server(quire, "--no-persist")
    yield ChatOpenAI(base_url=s.url + "/v1", api_key="unused", model="stories260K", max_retries=0, max_tokens=300)
    assert s.stop() == 0


def test_invoke(llm):
    msg = llm.invoke("Tell me a story.", stop=["\n"])
    assert isinstance(msg.content, str) and msg.response_metadata["finish_reason"] == "stop"


def test_with_structured_output_function_calling(llm):
    for _ in range(3):
        p = llm.with_structured_output(Person, method="function_calling").invoke("Who is in the story?")
        assert isinstance(p, Person) and 0 <= p.age <= 120 and len(p.name) <= 20


def test_bind_tools(llm):
    bound = llm.bind_tools([GetWeather], tool_choice="GetWeather")
    for _ in range(3):
        msg = bound.invoke("What is the weather in Paris?")
        assert msg.response_metadata["finish_reason"] in ("tool_calls", "stop")
        assert len(msg.tool_calls) == 1 and msg.tool_calls[0]["name"] == "GetWeather"
        assert GetWeather(**msg.tool_calls[0]["args"]).city is not None
    # Required with parallel calls off: one call, its arguments parsed.
    bound = llm.bind_tools([GetWeather, Person], tool_choice="required", parallel_tool_calls=False)
    msg = bound.invoke("What is the weather in Paris?")
    assert len(msg.tool_calls) == 1 and msg.tool_calls[0]["name"] in ("GetWeather", "Person")
    assert msg.response_metadata["finish_reason"] == "tool_calls"
