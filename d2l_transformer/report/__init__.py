"""What the chapter's runs are held against and reported as: the book's printed output and the
comparison table (`book`), the chapter's claim measured over seeds (`claim`), and what
``evaluate --model`` prints (`evaluation`)."""
