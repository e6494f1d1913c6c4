"""The command line's error policy (`cli`): an error the user can cause (a bad option, a
missing or damaged model or data, a file named on the command line that cannot be read or
written, a full disk) prints one line ``error: ...`` on stderr and exits with `EXIT_ERROR`; it
never prints a traceback. Anything else is a bug: its traceback is printed, then one line saying
so, and the exit status is `EXIT_BUG`. A reader that stops reading (``translate ... | head``) is
no error: the command stops quietly with 141, the status of a process ended by SIGPIPE, as the
shell's own tools do."""

import errno
import os
import sys
import traceback

EXIT_BAD_INPUT, EXIT_ERROR, EXIT_BUG = 1, 2, 3
EXIT_PIPE = 128 + 13  # SIGPIPE


def about_paths(error, paths):
    """True when the OSError `error` concerns one of `paths` (absolute): the path, a file in
    it, a directory on the way to it, or a save's sibling of it; or the disk being full."""
    if error.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return True
    names = [os.path.abspath(os.fsdecode(n)) for n in (error.filename, error.filename2)
             if isinstance(n, (str, bytes))]
    for path in paths:
        parent, base = os.path.split(path)
        for name in names:
            if name == path or name.startswith(path + os.sep) or \
                    path.startswith(name.rstrip(os.sep) + os.sep) or \
                    name.startswith(os.path.join(parent, f".{base}.")):
                return True
    return False


def guarded(func, args, user_errors, paths):
    """``func(args)`` under the policy: the exceptions `user_errors`, and an OSError about one
    of `paths` (`about_paths`), print one line and return EXIT_ERROR; anything else is a bug
    (its traceback, one line, EXIT_BUG); Ctrl-C is one line and 130; a closed stdout
    (BrokenPipeError) nothing and `EXIT_PIPE`."""
    try:
        code = func(args)
        if sys.stdout is not None:  # None: started without a stdout
            sys.stdout.flush()  # a closed pipe is found here, not at the interpreter's exit
        return code
    except BrokenPipeError:
        # nothing more can be written: stdout goes to /dev/null, so that the interpreter's
        # last flush does not fail again (the Python documentation's recipe, "SIGPIPE")
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):  # a stdout with no file behind it
            pass
        return EXIT_PIPE
    except user_errors as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except OSError as e:
        if not about_paths(e, paths):
            return _bug(e)
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - reported with its traceback
        return _bug(e)


def _bug(error):
    traceback.print_exc()
    print(f"error: unexpected {type(error).__name__} (a bug in d2l-transformer: the traceback "
          "is above)", file=sys.stderr)
    return EXIT_BUG
