"""What turns runs into results, shared by `encoderlab.evaluation` and `encoderlab.experiments` and importing
neither: result CSVs that grow a row per finished run (`rows`), summary statistics over seeds (`stats`), Markdown
tables (`tables`) and the plotting set-up (`plots`). Nothing here imports torch or transformers."""
