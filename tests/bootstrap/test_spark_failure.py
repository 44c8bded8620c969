"""One line out of a failed Spark job: its command, the executor's host and its own cause,
never py4j's "An error occurred while calling ..." (the texts as Spark 4 writes them; the
cluster tests in test_cluster.py meet the real ones)."""

from __future__ import annotations

from applier.bootstrap.spark import spark_failure
from applier.errors import EXIT_USAGE, BootstrapError, ConfigError

HEAD = (
    "An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.\n"
    ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 1 in stage 2.0 "
    "failed 4 times, most recent failure: Lost task 1.3 in stage 2.0 (TID 9) "
    "(worker-7 executor {executor}): "
)


def test_a_task_error_names_the_job_and_the_executor() -> None:
    text = HEAD.format(executor="1") + (
        "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        '  File "/x/applier/verify/job.py", line 80, in run_work\n'
        "applier.verify.hashing.VerifyError: the range query timed out\n"
        "\tat org.apache.spark.api.python.BasePythonRunner.handlePythonException(...)\n"
    )
    err = spark_failure(Exception(text), "verify")
    assert isinstance(err, BootstrapError)
    assert (
        err.message == "the Spark verify job failed on executor worker-7: the range query timed out"
    )
    assert "rerun `applier verify`" in str(err) and "\n" not in str(err)


def test_the_driver_executor_of_a_local_master_is_not_named() -> None:
    text = HEAD.format(executor="driver") + (
        "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        "psycopg.errors.InvalidTextRepresentation: bad\n"
    )
    err = spark_failure(Exception(text), "sync-tables")
    assert err.message == "the Spark sync-tables job failed: bad"


def test_a_cause_that_is_no_python_error_is_the_tasks_own_exception() -> None:
    text = HEAD.format(executor="2") + "java.io.IOException: No space left on device\n\tat x\n"
    err = spark_failure(Exception(text), "bootstrap")
    assert err.message == (
        "the Spark bootstrap job failed on executor worker-7: "
        "java.io.IOException: No space left on device"
    )


def test_executors_without_their_python_or_a_module_are_a_config_error() -> None:
    no_python = HEAD.format(executor="0") + (
        'java.io.IOException: Cannot run program "/opt/env/bin/python": error=2, '
        "No such file or directory\n"
    )
    err = spark_failure(Exception(no_python), "bootstrap")
    assert isinstance(err, ConfigError) and err.exit_code == EXIT_USAGE
    assert "executors on executor worker-7 cannot run Python /opt/env/bin/python" in err.message
    assert "executor_python" in str(err)
    no_module = HEAD.format(executor="0") + (
        "org.apache.spark.SparkException: Error from python worker:\n"
        "  /usr/bin/python3: Error while finding module specification for 'pyspark.daemon' "
        "(ModuleNotFoundError: No module named 'pyspark')\n"
    )
    err = spark_failure(Exception(no_module), "verify")
    assert isinstance(err, ConfigError)
    assert err.message.endswith("lacks the module pyspark") and "spark.archives" in str(err)
