module sandlot.dev/filetool

go 1.19
