"""A fake Azure OpenAI resource, on a real socket: the OpenAI fake's answers
behind Azure's addressing.

    POST /openai/deployments/{deployment}/chat/completions?api-version=...
    POST /openai/deployments/{deployment}/embeddings?api-version=...
    POST /openai/v1/chat/completions            (the newer v1 routes)
    POST /openai/responses?api-version=...      the Responses API (no deployment
    POST /openai/v1/responses                   route: the deployment is the body's
    GET|DELETE /openai[/v1]/responses/{id}      model), answered by the OpenAI fake

The key must come in the `api-key` header (401 otherwise, Azure's body);
a missing api-version is Azure's 404 "Resource not found".  The answer's
model is the deployment name, as Azure reports it.  Failure modes by path
prefix `/mode/<name>` as in FakeOpenAI.
"""
from __future__ import annotations

from tests.fakes import openai_upstream as oa


def _azure_err(handler, status, code, message):
    handler.set_status(status)
    handler.finish({"error": {"code": code, "message": message}})


class _AzureMixin:
    async def prepare(self):
        await super().prepare()
        if self._finished:
            return
        if not self.request.headers.get("api-key") or self.request.headers.get("api-key") == "bad-key":
            return _azure_err(self, 401, "401", "Access denied due to invalid subscription key "
                                                "or wrong API endpoint.")
        dep = self.path_kwargs.get("deployment")
        if dep is not None:
            if not self.get_query_argument("api-version", ""):
                return _azure_err(self, 404, "404", "Resource not found")
            self.body["model"] = dep


class AzureChat(_AzureMixin, oa.ChatHandler):
    async def post(self, mode=None, deployment=None):
        await super().post(mode)


class AzureEmbeddings(_AzureMixin, oa.EmbeddingsHandler):
    def post(self, mode=None, deployment=None):
        super().post(mode)


class _AzureResponses(_AzureMixin):
    async def prepare(self):
        await super().prepare()
        if not self._finished and "/openai/v1/" not in self.request.path and \
                not self.get_query_argument("api-version", ""):
            return _azure_err(self, 404, "404", "Resource not found")


class AzureResponses(_AzureResponses, oa.ResponsesHandler):
    pass


class AzureResponse(_AzureResponses, oa.ResponseHandler):
    pass


class FakeAzure(oa.FakeOpenAI):
    def routes(self):
        kw = {"fake": self}
        p = r"(?:/mode/(?P<mode>[a-z0-9]+))?/openai"
        d = p + r"/deployments/(?P<deployment>[^/]+)"
        return [(d + r"/chat/completions", AzureChat, kw),
                (d + r"/embeddings", AzureEmbeddings, kw),
                (p + r"/v1/chat/completions", AzureChat, kw),
                (p + r"/v1/embeddings", AzureEmbeddings, kw),
                (p + r"/(?:v1/)?responses", AzureResponses, kw),
                (p + r"/(?:v1/)?responses/(?P<rid>[^/]+)", AzureResponse, kw)]
