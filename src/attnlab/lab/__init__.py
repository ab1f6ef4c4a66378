"""The attention lab: a page in the browser, served on this machine, where a sentence one types
goes through the models named on the command line and every view of the explorer follows it,
with one head's arithmetic step by step, the next-token candidates under the sampling settings,
and heads switched off (``attnlab lab MODEL ...``)."""
