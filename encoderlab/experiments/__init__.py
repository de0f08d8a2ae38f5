"""The paper experiments: each a resumable sweep with its own subcommand (``encoderlab experiment NAME``) that
writes CSV results, a markdown summary and figures."""
