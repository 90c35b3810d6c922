# Installs the reference node packages in DIR (cmake -DDIR=... -DNPM=... -DCACHE=... -P npm_ci.cmake).
# Runs `npm ci` only when DIR/node_modules was not installed from the current package-lock.json.
file(READ "${DIR}/package-lock.json" lock)
set(stamp "${DIR}/node_modules/.glmserve-lock")
if(EXISTS "${stamp}")
  file(READ "${stamp}" installed)
  if(installed STREQUAL lock)
    message(STATUS "reference packages are up to date in ${DIR}/node_modules")
    return()
  endif()
endif()
execute_process(COMMAND "${NPM}" ci --no-audit --no-fund --ignore-scripts --cache "${CACHE}"
                WORKING_DIRECTORY "${DIR}" RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "npm ci failed in ${DIR} (${result}): the reference tokenizer packages could not be installed")
endif()
file(WRITE "${stamp}" "${lock}")
