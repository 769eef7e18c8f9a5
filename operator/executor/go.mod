module sandlot.dev/executor

go 1.21
