"""A Flask app with the cronoq.contrib.flask extension, served by Flask's
development server with the reloader (tests/test_wsgi_servers.py). Same
environment variables as app_plain.py, plus ``APP_PORT``."""

import os

from flask import Flask, jsonify, request

import cronoq
from cronoq.contrib.flask import Cronoq

from app_common import make_store, work

app = Flask(__name__)
tasks = Cronoq(app, pools=[cronoq.Pool("work", work, min=4, max=4, autoscale=False)], store=make_store,
               shutdown_grace=5.0)


@app.get("/submit")
def submit():
    key = request.args["key"]
    return jsonify(id=tasks.enqueue({"key": key}, pool="work", key=key), pid=os.getpid())


@app.get("/whoami")
def whoami():
    return jsonify(pid=os.getpid(), leading=tasks.scheduler.scheduler.leading)


if __name__ == "__main__":
    app.run(host="127.0.0.1", port=int(os.environ["APP_PORT"]), debug=False, use_reloader=True)
